#!/usr/bin/env bash
# Call N: call M found two splits faster at 64k / 128k batch 32 (256 programs, 1.94 waves: 0.5-0.9%) and slower at
# batch 16 (one wave). Two splits at batch 32 and 64 over the other cache lengths, contiguous and paged, with the append.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 32 64 \
  --variants auto auto+s2 --rounds 3 --append > "$OUT/ab-s2.log" 2>&1
echo "ab exit $?"
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 65536 131072 --batches 64 \
  --variants auto auto+s2 --rounds 2 --append > "$OUT/ab-s2-long.log" 2>&1
echo "ab long exit $?"
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 65536 --batches 32 --page-size 256 \
  --variants auto auto+s2 --rounds 3 --append > "$OUT/ab-s2-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep -h "^|" "$OUT/ab-s2.log" "$OUT/ab-s2-long.log" "$OUT/ab-s2-paged.log"
