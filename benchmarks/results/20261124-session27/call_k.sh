#!/usr/bin/env bash
# Call K: compute-sanitizer memcheck over the Gluon decode tests with the early first block in every launch (split 0's
# block 0 copied before the length arrives; an empty sequence's loader waiting for that copy), every consumer form.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
SANITIZER_TESTS=tests/test_kvcache.py SANITIZER_SELECT="gluon_decode_matches and early-always and bfloat16" \
  SANITIZER_TIMEOUT=400 OUT="$OUT/memcheck" bash benchmarks/kvcache_sanitizer.sh 2>&1 | tail -5
