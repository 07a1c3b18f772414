#!/usr/bin/env bash
# Call C: with launch plans on (the default), the gpu-marked tests of the files on the changed path (as session 15's
# call I), plus test_launch_plans and test_launcher; then the breakdown of hdim 128 causal 512 after the raw-stream
# change.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 120 python3 benchmarks/host_breakdown.py --head-dim 128 --causal --calls 300 > "$OUT/breakdown-128-causal.txt" 2>&1
grep -E "^unwrapped|_run|replay|planned|CudaLauncher" "$OUT/breakdown-128-causal.txt" | head -40
timeout 440 python3 -m pytest -q -m gpu -n 8 -k "not float32 and not large" -p no:cacheprovider tests/test_launch_plans.py \
  tests/test_launcher.py tests/test_api.py tests/test_kernels.py tests/test_sdpa.py tests/test_varlen.py \
  tests/test_backward_hopper.py tests/test_dq_hopper.py tests/test_forward_hopper.py tests/test_dkdv_loops.py \
  tests/test_dkdv_split.py tests/test_nn.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
