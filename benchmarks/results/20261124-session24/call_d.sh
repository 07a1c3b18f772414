#!/usr/bin/env bash
# Call D: do the split streams' aligned starts cost (call C: 6 splits beat 8 at batch 2, 3 beat 4 at batch 4)? The
# Gluon decode kernel with each (sequence, split) stream starting its whole blocks at its own offset (+rotate),
# against the automatic split count and call C's best, with the append, beside the Triton kernel and cuDNN.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
ab() {  # NAME LIMIT ARGS...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --rounds 2 --append "$@" \
    > "$OUT/ab-$name.log" 2>&1
  echo "ab $name exit $?"
}
ab b2 110 --batches 2 --variants auto auto+rotate auto+s6 auto+s6+rotate
ab b4 110 --batches 4 --variants auto auto+rotate auto+s3 auto+s3+rotate
ab b1-8-16 200 --batches 1 8 16 --variants auto auto+rotate
ab paged 100 --batches 2 16 --page-size 256 --variants auto auto+rotate
grep -E "Error|Traceback" -A3 "$OUT"/*.log | head -20
for f in b1-8-16 b2 b4 paged; do grep "^|" "$OUT/ab-$f.log"; done
