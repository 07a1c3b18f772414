#!/usr/bin/env bash
# Call A: packed calls' consumers take their sequence's bounds from the loader's hand-off (no global load at a
# tile's start) against the kernel before (4601e33's file, carried in scratch/), kernel-only, packed and dense on
# the same tokens; then the forward and varlen GPU tests on the tree.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
CASES="128 0 512 1;128 1 512 1;128 0 1024 1;128 1 1024 1;128 0 16384 1;128 1 16384 1;64 0 512 1;128 0 512 0" ROUNDS=4 \
  PYTHONPATH=src timeout 280 python3 benchmarks/varlen_fwd_ab.py old=scratch/forward_hopper_4601e33.py new \
  > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 300 tests/test_forward_hopper.py tests/test_varlen.py
