#!/usr/bin/env bash
# Call N: the review's loader (the early first block's run-time checks compiled into EARLY_FIRST_BLOCK builds only):
# decode GPU tests.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 220 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
