#!/usr/bin/env bash
# Call A: (1) GPU tests of the forward with Q released after each consumer's last Q K^T; (2) kernel-only A/B of that
# (new) against the release after the last P V (variants/release_q_late.py, session 21's kernel) and against a
# second Q buffer at hdim <= 128 (variants/double_q.py); (3) the hdim-64 short Triton tiles (sweep, twice).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261124-session22
source benchmarks/gpu_tests.sh
run_tests forward 150 tests/test_forward_hopper.py
CASES="256 0 512 128x64x8x2+ws+persistent;256 1 512 128x64x8x2+ws+persistent;128 0 512 128x128x8x2+ws+persistent;128 0 1024 128x128x8x2+ws+persistent;128 1 1024 128x64x8x3+ws+persistent;128 1 2048 128x128x8x2+ws+persistent;64 0 512 128x128x8x3+ws+consumers3+persistent;64 0 1024 128x128x8x3+ws+consumers3+persistent" \
  REPEAT=4 timeout 240 python3 benchmarks/fwd_ab.py late=$HERE/variants/release_q_late.py double=$HERE/variants/double_q.py 2>&1 | tee "$OUT/fwd_ab.log"
SWEEPS=benchmarks/sweeps/forward-short-64.txt REPEAT=2 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      forward" | tail -40
