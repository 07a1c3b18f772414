#!/usr/bin/env bash
# Call L: the GPU tests of every file that reaches the decode path at the final decode code (call J's two failures
# were the streaming-launch test, which now pins the Triton kernel); then the split counts of the swapped Gluon
# kernel at batch 1-8 (the rule was tuned on the padded rows), whole steps with the append as the bench times them.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 170 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 220 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 \
  --splits 0 2 3 4 6 8 12 16 --out "$OUT/splits.json" > "$OUT/splits.log" 2>&1
echo "splits exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/splits.log | head -20
grep "^|" "$OUT/splits.log"
