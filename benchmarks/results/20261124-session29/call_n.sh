#!/usr/bin/env bash
# Call N (review: the block steps derive the ring position; SASS identical on the checked builds): the two-Q check;
# GPU tests of the forward, varlen and decode files.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
S=benchmarks/results/20261124-session29
PYTHONPATH=src timeout 60 python3 $S/q_tiles_check.py 2>&1 | tail -1
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 330 tests/test_forward_hopper.py tests/test_varlen.py
WORKERS=12 run_tests decode 180 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py \
  tests/test_api.py tests/test_launch_plans.py tests/test_varlen_paged.py
