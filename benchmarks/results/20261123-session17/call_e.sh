#!/usr/bin/env bash
# Call E: a decode step with unchecked indices planned whole (kvcache._plannable_step): the GPU tests of the plans,
# the API and the KV cache; the serving calls' host time.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests plans-api 200 tests/test_launch_plans.py tests/test_launcher.py tests/test_api.py
run_tests kvcache 200 tests/test_kvcache.py tests/test_varlen_paged.py tests/test_combine.py tests/test_bench_decode.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
timeout 150 python3 benchmarks/host_serving.py --calls 300 --breakdown 2>&1 | tee "$OUT/host_serving.log" | grep -v Warning
