#!/usr/bin/env bash
# Call H (H100): split counts on an H100 where the grid left room: batch 8 unsplit (+s1; the rule splits it in two)
# and batch 16 in two splits (+s2; the rule leaves it whole), contiguous and paged; five alternating rounds.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 8 16 \
  --variants auto auto+s1 auto+s2 --rounds 5 --append > "$OUT/ab.log" 2>&1
echo "ab exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 8 16 --variants auto auto+s1 auto+s2 \
  --rounds 5 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^| [0-9]" "$OUT/ab.log" "$OUT/ab-paged.log"
