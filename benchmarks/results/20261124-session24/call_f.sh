#!/usr/bin/env bash
# Call F: is the Gluon decode kernel's consumer on its critical path? A probe whose consumer only waits for and
# releases each block (+streamonly: no products, no softmax; its outputs are garbage, flagged WRONG) against the
# kernel, the Triton kernel and cuDNN, with the append.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 250 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 8 16 \
  --variants auto auto+streamonly --rounds 2 --append > "$OUT/ab-stream.log" 2>&1
echo "ab stream exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-stream.log" | sed 's/ WRONG.*$/ (streamonly WRONG, as expected)/'
