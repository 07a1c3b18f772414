#!/usr/bin/env bash
# Call F: the half-width steps folded into the whole-block steps (same instructions, another schedule in the packed
# hdim-128 build) against call C's build (08f8add's file, scratch/) and 4601e33's, kernel-only; then the forward,
# varlen and decode GPU tests on the tree.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
CASES="128 0 32 1;128 0 96 1" ROUNDS=1 CHECK_ONLY=1 PYTHONPATH=src timeout 60 \
  python3 benchmarks/varlen_fwd_ab.py new > "$OUT/varlen-check.log" 2>&1
echo "varlen check exit $?"; cat "$OUT/varlen-check.log"
CASES="128 0 512 1;128 0 1024 1;128 0 512 0" ROUNDS=3 PYTHONPATH=src timeout 130 python3 benchmarks/varlen_fwd_ab.py \
  old=scratch/forward_hopper_4601e33.py callc=scratch/forward_hopper_08f8add.py new > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 250 tests/test_forward_hopper.py tests/test_varlen.py
WORKERS=12 run_tests decode 150 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py \
  tests/test_api.py tests/test_launch_plans.py tests/test_varlen_paged.py
