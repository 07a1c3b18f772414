#!/usr/bin/env bash
# Call O: the final code (the Gluon decode kernel's scalar for keys appended before): test_kvcache, test_api and
# test_launch_plans GPU tests.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests final 200 tests/test_kvcache.py tests/test_api.py tests/test_launch_plans.py tests/test_combine.py
