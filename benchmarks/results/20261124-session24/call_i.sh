#!/usr/bin/env bash
# Call I: the swapped Gluon decode kernel (64 x 4) past the table's gates (+everywhere): two to four waves at batch
# 32-64, 16k batch 16 and the 64k steps, where the rows form lost 1-2% to the Triton kernel (call E).
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 16 32 64 \
  --variants auto+everywhere --rounds 2 --append > "$OUT/ab-large.log" 2>&1
echo "ab large exit $?"
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 65536 131072 --batches 1 4 8 16 \
  --variants auto+everywhere --rounds 2 --append > "$OUT/ab-long.log" 2>&1
echo "ab long exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 16384 --batches 32 4 --page-size 256 \
  --variants auto+everywhere --rounds 2 --append > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-large.log"; grep "^|" "$OUT/ab-long.log"; grep "^|" "$OUT/ab-paged.log"
