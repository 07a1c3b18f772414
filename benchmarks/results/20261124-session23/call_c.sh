#!/usr/bin/env bash
# Call C: the fused merge, the next kernel released at exit (table), against the combine launch (+combine), release
# after the key loops (+keys) and from the start (+early); auto split count.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
S=benchmarks/results/20261124-session23
timeout 200 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 65536 --batches 1 4 8 16 32 \
  --configs 64x4x3+combine 64x4x3+keys 64x4x3+early --auto-only --out "$OUT/ab-contiguous-1.json" \
  > "$OUT/ab-contiguous-1.log" 2>&1
echo "contiguous round 1 exit $?"
timeout 60 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 --batches 1 4 16 --page-size 256 \
  --configs 64x4x3+combine --auto-only --out "$OUT/ab-paged-1.json" > "$OUT/ab-paged-1.log" 2>&1
echo "paged round 1 exit $?"
timeout 120 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 65536 --batches 1 4 8 16 32 \
  --configs 64x4x3+combine --auto-only --out "$OUT/ab-contiguous-2.json" > "$OUT/ab-contiguous-2.log" 2>&1
echo "contiguous round 2 exit $?"
python3 $S/ab_summary.py "$OUT"/ab-contiguous-*.json
python3 $S/ab_summary.py "$OUT"/ab-paged-*.json
