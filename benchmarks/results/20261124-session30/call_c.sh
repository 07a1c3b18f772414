#!/usr/bin/env bash
# Call C: packed non-causal calls compute a last key block that holds at most half a block at half width
# (forward_hopper.half_tails), against 4601e33's kernel (scratch/), kernel-only with per-sequence checks; lengths
# under 64 (every block a half one) and under 192 first; then the forward and varlen GPU tests on the tree.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
CASES="128 0 32 1;128 0 96 1;64 0 96 1" ROUNDS=1 CHECK_ONLY=1 PYTHONPATH=src timeout 120 \
  python3 benchmarks/varlen_fwd_ab.py old=scratch/forward_hopper_4601e33.py new > "$OUT/varlen-check.log" 2>&1
echo "varlen check exit $?"; cat "$OUT/varlen-check.log"
CASES="128 0 512 1;128 0 1024 1;128 0 2048 1;64 0 512 1;128 1 512 1;128 0 512 0" ROUNDS=3 \
  PYTHONPATH=src timeout 200 python3 benchmarks/varlen_fwd_ab.py old=scratch/forward_hopper_4601e33.py new \
  > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 260 tests/test_forward_hopper.py tests/test_varlen.py
