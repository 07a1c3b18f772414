#!/usr/bin/env bash
# Call F: causal hdim 64 takes the three-consumer Gluon forward from 4k (configs._WS_FROM_SEQLEN): the forward's GPU
# tests in full, test_launch_plans, and the gpu-marked hdim-64 tests of test_varlen, test_api and test_kernels.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 560 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider -k "not float32 and not large" \
  tests/test_forward_hopper.py tests/test_launch_plans.py tests/test_configs.py tests/test_varlen.py tests/test_api.py \
  > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
