#!/usr/bin/env bash
# Call P: the review's kernel edit (the padded consumer's Q-release and turn barriers allocated in its branch only):
# the GPU tests of every file that reaches the decode path.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 170 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
