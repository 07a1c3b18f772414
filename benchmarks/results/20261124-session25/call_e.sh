#!/usr/bin/env bash
# Call E: call D found the programs of a long unsplit step ending up to 58 us apart (64k batch 16), the SMs left at
# the end streaming with fewer blocks in flight than the HBM needs: 5 and 6 ring stages (64-key blocks) against 4, with
# the append, on long and multi-wave steps; then the timeline of 64k batch 16 on 6 stages.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 260 python3 benchmarks/decode_gluon_ab.py --cache-lens 65536 131072 16384 --batches 16 32 \
  --variants auto 64x5 64x6 --rounds 3 --append > "$OUT/ab-stages-long.log" 2>&1
echo "ab long exit $?"
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 4 16 32 64 \
  --variants auto 64x5 64x6 --rounds 3 --append > "$OUT/ab-stages.log" 2>&1
echo "ab exit $?"
grep -E "Error|Traceback" -A5 "$OUT"/ab-*.log | head -30
cat "$OUT/ab-stages-long.log" "$OUT/ab-stages.log" | grep "^|"
