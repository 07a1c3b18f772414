#!/usr/bin/env bash
# Call L: call K's five failures (CUDA out of memory: 12 workers on the 8k x 8k cases) again on 2 workers.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
WORKERS=2 run_tests large-128 200 tests/test_kernels.py -k "large and 8192 and 128"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
