#!/usr/bin/env bash
# Call E: deeper pipelines at about one program per SM (no merge) against the table's splits of 3 stages, batch 4-16.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 400 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 --batches 4 8 16 \
  --configs 64x4x4 64x4x6 128x4x3 --splits 1 2 4 8 --out "$OUT/stages.json" > "$OUT/stages.log" 2>&1
echo "sweep exit $?"
cat "$OUT/stages.log" | grep "^|"
