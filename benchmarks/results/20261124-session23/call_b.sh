#!/usr/bin/env bash
# Call B: the fused merge with the next kernel released after the key loop (table) against the combine launch
# (+combine) and the fused merge released from the start (+early), auto split count; unsplit large batches too.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
S=benchmarks/results/20261124-session23
timeout 240 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 65536 --batches 1 2 4 8 16 32 64 \
  --configs 64x4x3+combine 64x4x3+early --auto-only --out "$OUT/ab-contiguous-1.json" > "$OUT/ab-contiguous-1.log" 2>&1
echo "contiguous round 1 exit $?"
timeout 90 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 --batches 1 4 16 32 --page-size 256 \
  --configs 64x4x3+combine 64x4x3+early --auto-only --out "$OUT/ab-paged-1.json" > "$OUT/ab-paged-1.log" 2>&1
echo "paged round 1 exit $?"
timeout 150 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 65536 --batches 1 2 4 8 16 32 64 \
  --configs 64x4x3+combine --auto-only --out "$OUT/ab-contiguous-2.json" > "$OUT/ab-contiguous-2.log" 2>&1
echo "contiguous round 2 exit $?"
python3 $S/ab_summary.py "$OUT"/ab-contiguous-*.json
python3 $S/ab_summary.py "$OUT"/ab-paged-*.json
