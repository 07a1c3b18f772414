#!/usr/bin/env bash
# Call H: the GPU suites that replay dense launch plans (every repeated call in a test does), after this session's
# launcher changes (addresses to the launcher, the aliasing key, every input's device): kernels, SDPA, the Hopper
# kernels, the dK/dV forms, nn and the API. Each suite has its own time limit; the table is last.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export WORKERS=12
source benchmarks/gpu_tests.sh
run_tests hopper 150 tests/test_forward_hopper.py tests/test_backward_hopper.py tests/test_dq_hopper.py
run_tests kernels 170 tests/test_kernels.py
run_tests sdpa-nn 120 tests/test_sdpa.py tests/test_nn.py tests/test_sdpa_override.py
run_tests loops-api 110 tests/test_dkdv_loops.py tests/test_dkdv_split.py tests/test_mask_skip.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
