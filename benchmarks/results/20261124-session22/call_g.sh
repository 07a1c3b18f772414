#!/usr/bin/env bash
# Call G: the full ANCHORS grid with the SDPA providers on the final table (two Q tiles, persistent up to 4k).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
timeout 400 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out "$OUT/bench" \
  --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
tail -5 "$OUT/bench.log"
