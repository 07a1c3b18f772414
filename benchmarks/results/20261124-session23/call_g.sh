#!/usr/bin/env bash
# Call G: the Gluon decode kernel (no append, contiguous caches): its GPU tests, then steps against the Triton
# kernel and cuDNN (ratio > 1: faster than cuDNN).
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=4 run_tests gluon 150 tests/test_kvcache.py -k gluon
grep -E "Error|error:" "$OUT/tests-gluon.log" | head -5
export PYTHONPATH=src
timeout 300 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 65536 --batches 1 4 8 16 32 \
  --variants 64x6 64x4 128x3 --rounds 2 > "$OUT/ab.log" 2>&1
echo "ab exit $?"
grep "^|" "$OUT/ab.log"; grep -E "Error|Traceback" -A3 "$OUT/ab.log" | head -20
