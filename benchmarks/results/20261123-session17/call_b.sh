#!/usr/bin/env bash
# Call B: launch plans for varlen calls and KV-cache steps, and the aliasing fix (one tensor as q, k and v): the plan
# tests, the GPU tests of the KV cache, paged varlen and varlen; then the host time of serving calls.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
source benchmarks/gpu_tests.sh
run_tests plans 150 tests/test_launch_plans.py tests/test_launcher.py
run_tests kvcache 200 tests/test_kvcache.py tests/test_varlen_paged.py tests/test_combine.py
run_tests varlen 200 tests/test_varlen.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
timeout 150 python3 benchmarks/host_serving.py --calls 300 2>&1 | tee "$OUT/host_serving.log" | grep -v Warning
