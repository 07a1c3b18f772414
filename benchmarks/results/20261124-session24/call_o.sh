#!/usr/bin/env bash
# Call O: the last kernel edit (the swapped loop's ring slots through one helper, the same instructions): the Gluon
# decode tests and the rest of test_kvcache on the GPU.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py tests/test_api.py
