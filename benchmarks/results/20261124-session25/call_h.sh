#!/usr/bin/env bash
# Call H: paged steps run 0.5-1.5% longer than contiguous ones of the same size (call D's timeline: the stream itself,
# not the start or end). Page sizes 64-4096 (4096: one page a sequence at 4k) against the contiguous cache, with the
# append: per-page costs (lookups, TLB reach of scattered pages) grow as the pages shrink.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
for page in 0 64 256 1024 4096; do
  timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 4 16 32 --page-size $page \
    --variants auto --rounds 3 --append > "$OUT/ab-page-$page.log" 2>&1
  echo "page $page exit $?"
  grep "^| [0-9]" "$OUT/ab-page-$page.log"
done
