#!/usr/bin/env bash
# Call K: the Gluon decode kernel on paged caches too: its GPU tests, memcheck over them, then paged steps (with the
# append) against the Triton kernel and cuDNN (on a contiguous cache).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=8 run_tests gluon 120 tests/test_kvcache.py tests/test_varlen_paged.py -k "gluon or paged"
SANITIZER_TESTS=tests/test_kvcache.py SANITIZER_SELECT="gluon_decode_matches" SANITIZER_TIMEOUT=200 \
  bash benchmarks/kvcache_sanitizer.sh 2>&1 | tail -3
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 65536 --batches 1 4 8 16 \
  --variants auto --rounds 2 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^|" "$OUT/ab-paged.log"; grep -E "Error|Traceback" -A3 "$OUT/ab-paged.log" | head -20
