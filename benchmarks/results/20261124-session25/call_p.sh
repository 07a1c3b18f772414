#!/usr/bin/env bash
# Call P: the review's kernel edit (the swapped consumers' shared arguments in one tuple; S^T and O^T's one layout
# without the no-op conversions): decode GPU tests, then a short A/B against cuDNN to see the steps unchanged.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 170 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 90 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 65536 --batches 1 16 32 --variants auto auto+c1 \
  --rounds 2 --append > "$OUT/ab.log" 2>&1
echo "ab exit $?"
grep "^|" "$OUT/ab.log"
