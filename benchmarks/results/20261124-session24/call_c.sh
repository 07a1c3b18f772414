#!/usr/bin/env bash
# Call C: split counts of the Gluon decode kernel at batch 1-8 (call B's profile: 6 splits beat the automatic 8 at 4k
# batch 2), whole steps with the append as the bench times them; then its tiles at batch 8-16 beside cuDNN.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 240 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 \
  --splits 0 3 4 5 6 8 10 12 16 --out "$OUT/splits.json" > "$OUT/splits.log" 2>&1
echo "splits exit $?"
timeout 100 python3 benchmarks/decode_splits.py --cache-lens 4096 16384 --batches 1 2 4 --page-size 256 \
  --splits 0 4 6 8 12 16 --out "$OUT/splits-paged.json" > "$OUT/splits-paged.log" 2>&1
echo "splits paged exit $?"
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 8192 16384 --batches 8 16 \
  --variants auto 64x4 64x6 --rounds 2 --append > "$OUT/ab-tiles.log" 2>&1
echo "ab tiles exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/*.log | head -20
grep "^|" "$OUT/splits.log" "$OUT/splits-paged.log" "$OUT/ab-tiles.log"
