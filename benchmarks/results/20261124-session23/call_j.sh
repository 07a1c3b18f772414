#!/usr/bin/env bash
# Call J: test_kvcache's GPU tests after the forced-forms tests pin the Triton kernel; compute-sanitizer memcheck over
# the Gluon decode tests (its appends, partial and final stores).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py tests/test_api.py
SANITIZER_TESTS=tests/test_kvcache.py SANITIZER_SELECT="gluon_decode_matches" SANITIZER_TIMEOUT=300 \
  bash benchmarks/kvcache_sanitizer.sh 2>&1 | tail -6
