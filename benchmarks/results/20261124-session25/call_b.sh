#!/usr/bin/env bash
# Call B: two Gluon decode programs an SM (swapped products on 3 ring stages, 80 registers a thread at launch) against
# one (4 stages, 168), with the append: unsplit batch 16-64 (several waves), split batch 1-8, paged.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 65536 --batches 16 32 64 \
  --variants auto auto+pair --rounds 3 --append > "$OUT/ab-pair.log" 2>&1
echo "ab pair exit $?"
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 16384 --batches 1 4 8 \
  --variants auto auto+pair --rounds 3 --append > "$OUT/ab-pair-split.log" 2>&1
echo "ab pair split exit $?"
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 4 16 32 --page-size 256 \
  --variants auto auto+pair --rounds 3 --append > "$OUT/ab-pair-paged.log" 2>&1
echo "ab pair paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep -h "^|" "$OUT"/ab-pair.log "$OUT"/ab-pair-split.log "$OUT"/ab-pair-paged.log
