#!/usr/bin/env bash
# Call D: replays hand the launcher addresses, every input's device in the plan key, eager_call's direct path with
# grad mode on: the GPU tests of the plans, the API, the KV cache and varlen; the serving calls' host time again.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests plans-api 200 tests/test_launch_plans.py tests/test_launcher.py tests/test_api.py
run_tests kvcache 150 tests/test_kvcache.py tests/test_varlen_paged.py tests/test_combine.py
run_tests varlen 150 tests/test_varlen.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
timeout 150 python3 benchmarks/host_serving.py --calls 300 --breakdown 2>&1 | tee "$OUT/host_serving.log" | grep -v Warning
