#!/usr/bin/env bash
# Call H: with launch plans on, the unmarked 16-bit tests of test_kernels, test_sdpa, test_nn and test_compile on the
# GPU (as session 15's call J), then the rest of test_launch_plans and test_api's gpu-marked tests.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 420 python3 -m pytest -q -n 8 -k "not float32 and not large" -p no:cacheprovider tests/test_launch_plans.py \
  tests/test_compile.py tests/test_nn.py tests/test_sdpa.py tests/test_kernels.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
