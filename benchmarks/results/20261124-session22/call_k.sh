#!/usr/bin/env bash
# Call K: the GPU test files this session's calls did not run (every one that runs the forward: the backward, dQ and
# dK/dV tests call it first), on the final code.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests rest 540 tests/test_backward_hopper.py tests/test_combine.py tests/test_dkdv_loops.py \
  tests/test_dkdv_split.py tests/test_dq_hopper.py tests/test_iomeasure.py tests/test_kernels.py tests/test_kvcache.py \
  tests/test_launcher.py tests/test_mask_skip.py tests/test_measure.py tests/test_sdpa.py tests/test_transformers.py \
  tests/test_varlen_paged.py
