#!/usr/bin/env bash
# Call K: swapped products on 128-key ring stages, two 64-key products a stage (one cross-warp max and one P^T
# hand-off per 128 keys instead of two; call G's single 128-key products faulted): test_kvcache's GPU tests (the
# Gluon tests on 64- and 128-key stages), then 128 x 3 against 64 x 4 with the append, contiguous and paged.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 16 \
  --variants auto 128x3 --rounds 2 --append > "$OUT/ab-stages.log" 2>&1
echo "ab stages exit $?"
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 65536 --batches 32 64 4 \
  --variants auto 128x3 --rounds 2 --append > "$OUT/ab-large.log" 2>&1
echo "ab large exit $?"
timeout 80 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 --batches 4 16 --page-size 256 \
  --variants auto 128x3 --rounds 2 --append > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-stages.log"; grep "^|" "$OUT/ab-large.log"; grep "^|" "$OUT/ab-paged.log"
