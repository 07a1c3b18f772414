#!/usr/bin/env bash
# Call H: the Gluon decode kernel with its fused append and its tile rule: its GPU tests (the rest of test_kvcache
# too), then steps with the append (the bench's flashattn column) and without, against Triton and cuDNN.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=4 run_tests gluon 120 tests/test_kvcache.py -k gluon
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 65536 --batches 1 2 4 8 16 \
  --variants auto --rounds 2 --append > "$OUT/ab-append.log" 2>&1
echo "ab append exit $?"
grep "^|" "$OUT/ab-append.log"; grep -E "Error|Traceback" -A3 "$OUT/ab-append.log" | head -20
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 65536 --batches 1 2 4 8 16 \
  --variants auto --rounds 1 > "$OUT/ab-noappend.log" 2>&1
echo "ab no-append exit $?"
grep "^|" "$OUT/ab-noappend.log"
