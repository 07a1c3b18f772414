#!/usr/bin/env bash
# Call I: call H found paged steps 0.5-1% longer than contiguous ones even with one 4096-key page a sequence; the
# contiguous kernel rotates each split stream's start (call D of session 24), the paged one does not: paged steps
# with rotated streams (+rotate) against without, pages of 256 and 4096 keys, with the append.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
for page in 256 4096; do
  timeout 110 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 4 16 32 --page-size $page \
    --variants auto auto+rotate --rounds 3 --append > "$OUT/ab-rotate-$page.log" 2>&1
  echo "page $page exit $?"
  grep "^| [0-9]" "$OUT/ab-rotate-$page.log"
done
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 16384 65536 --batches 8 16 32 --page-size 256 \
  --variants auto auto+rotate --rounds 3 --append > "$OUT/ab-rotate-long.log" 2>&1
echo "long exit $?"
grep "^| [0-9]" "$OUT/ab-rotate-long.log"
