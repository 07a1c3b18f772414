#!/usr/bin/env bash
# Call A: the Gluon decode kernel launched chained (programmatic dependent launch, as the Triton kernels and the merge
# already are) and a paged block's row looked up four blocks ahead instead of one: test_kvcache's GPU tests, then
# the A/B of each against the other form, with the append, contiguous and paged.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py
export PYTHONPATH=src
timeout 170 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 65536 --batches 1 4 16 32 \
  --variants auto auto+unchained --rounds 3 --append > "$OUT/ab-chained.log" 2>&1
echo "ab chained exit $?"
timeout 170 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 65536 --batches 1 4 16 32 --page-size 256 \
  --variants auto auto+unchained auto+ahead1 --rounds 3 --append > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-chained.log"; grep "^|" "$OUT/ab-paged.log"
