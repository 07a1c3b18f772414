#!/usr/bin/env bash
# Call I: GPU tests of the final code (4a9c780) on the paths this session changed: the backward (both streams), the
# short causal forward tile, the Gluon kernels' callers. 8 workers (14 ran call C's large cases out of memory).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 560 python3 -m pytest -q -m gpu -n 8 -k "not float32 and not large" tests/test_api.py tests/test_kernels.py \
  tests/test_sdpa.py tests/test_varlen.py tests/test_backward_hopper.py tests/test_dq_hopper.py \
  tests/test_forward_hopper.py tests/test_dkdv_loops.py tests/test_dkdv_split.py tests/test_nn.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
