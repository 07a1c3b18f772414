#!/usr/bin/env bash
# Call J: the unmarked tests of the backward and forward files on the GPU (they run on CUDA when one is there;
# call I took only the gpu-marked ones), 16-bit, not the large cases (call E ran those: 180 passed), at b35b384.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 560 python3 -m pytest -q -n 8 -k "not float32 and not large" -p no:cacheprovider tests/test_kernels.py \
  tests/test_api.py tests/test_sdpa.py tests/test_varlen.py tests/test_nn.py tests/test_compile.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
