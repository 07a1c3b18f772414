#!/usr/bin/env bash
# Call H: the Gluon dQ stores dQ 16 bytes a thread where its shared memory leaves room (as the forward's O). GPU tests
# of the dQ, then an A/B of the wide stores (forward and backward) on the cells that run the Gluon dQ (hdim 128 from
# 2k) and with the Gluon dQ forced at 512 / 1k, where the table keeps the Triton dQ.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261123-session21
source benchmarks/gpu_tests.sh
run_tests dq 150 tests/test_dq_hopper.py
CASES="128 0 2048;128 0 4096;128 0 16384;128 1 4096;128 0 1024 128x64x8x3+ws;128 0 512 128x64x8x3+ws;128 1 1024 128x64x8x3+ws;128 0 1024" \
  REPEAT=4 timeout 250 python3 $HERE/ab_wide.py 2>&1 | tee "$OUT/ab_wide.log"
