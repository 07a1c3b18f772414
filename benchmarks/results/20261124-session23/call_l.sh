#!/usr/bin/env bash
# Call L: the paged Gluon loader looks each block's page up one block ahead: its GPU tests, memcheck, paged steps.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=8 run_tests gluon 120 tests/test_kvcache.py -k "gluon or paged"
SANITIZER_TESTS=tests/test_kvcache.py SANITIZER_SELECT="gluon_decode_matches" SANITIZER_TIMEOUT=200 \
  bash benchmarks/kvcache_sanitizer.sh 2>&1 | tail -2
export PYTHONPATH=src
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 4 8 16 \
  --variants auto --rounds 2 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^|" "$OUT/ab-paged.log"; grep -E "Error|Traceback" -A3 "$OUT/ab-paged.log" | head -20
