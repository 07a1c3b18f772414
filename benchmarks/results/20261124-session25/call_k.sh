#!/usr/bin/env bash
# Call K: call J's early release of the merge cost 1-1.4 us a split step, as call A's chained attention did: does
# the merge's own chaining (launch_pdl, griddepcontrol.wait at its start) cost too after the unchained Gluon kernel?
# "+late" (main's merge) against "+late+plain" (the merge launched plainly), split steps with the append.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 \
  --variants auto+late auto+late+plain --rounds 3 --append > "$OUT/ab-plain.log" 2>&1
echo "ab exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 1 4 8 --page-size 256 \
  --variants auto+late auto+late+plain --rounds 3 --append > "$OUT/ab-plain-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep -h "^|" "$OUT/ab-plain.log" "$OUT/ab-plain-paged.log"
