#!/usr/bin/env bash
# Call K: the final code's API and plan tests (eager_call keeps the op for any tensor subclass that requires grad),
# and the kernel tests at the capped shortest causal hdim-128 tile (512 tokens and below).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests api-plans 150 tests/test_api.py tests/test_launch_plans.py tests/test_launcher.py
WORKERS=12 run_tests kernels-128 200 tests/test_kernels.py -k "128"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
