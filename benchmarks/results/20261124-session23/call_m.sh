#!/usr/bin/env bash
# Call M: paged steps (with the append), the Triton kernel against the Gluon one. Calls K and L compared the Gluon
# kernel with itself: their "triton" side left GLUON_DECODE on, which took paged caches then.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 16 \
  --variants auto --rounds 2 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^|" "$OUT/ab-paged.log"; grep -E "Error|Traceback" -A3 "$OUT/ab-paged.log" | head -20
