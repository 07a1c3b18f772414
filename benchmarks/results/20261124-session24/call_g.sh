#!/usr/bin/env bash
# Call G: the Gluon decode kernel's consumer with swapped products (S^T = K Q^T, O^T += V^T P^T: keys and head dims
# along wgmma's rows, the GQA group's query rows along N = 8; call F: the consumer's math costs 4-8% of a step): its
# GPU tests (groups of 1-16 swapped, 32 on the rows form), then swapped against the rows form (+rows), with the
# append, contiguous and paged, beside the Triton kernel and cuDNN.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 16 \
  --variants auto auto+rows --rounds 2 --append > "$OUT/ab-swapped.log" 2>&1
echo "ab swapped exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 16384 --batches 2 16 --page-size 256 \
  --variants auto auto+rows --rounds 2 --append > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-swapped.log"; grep "^|" "$OUT/ab-paged.log"
