#!/usr/bin/env bash
# Call H: the swapped consumer on 64-key blocks only (call G: its 128-key tiles faulted; 64 x 4 passed and ran
# 1.5-5% faster than the rows form): the GPU tests of test_kvcache, then swapped on 4 and 6 stages against the rows
# form (+rows), with the append, contiguous and paged, beside the Triton kernel and cuDNN.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py
export PYTHONPATH=src
timeout 230 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 16 \
  --variants auto 64x4 64x6 auto+rows --rounds 2 --append > "$OUT/ab-swapped.log" 2>&1
echo "ab swapped exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 16384 --batches 2 16 --page-size 256 \
  --variants auto auto+rows --rounds 2 --append > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-swapped.log"; grep "^|" "$OUT/ab-paged.log"
