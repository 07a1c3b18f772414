#!/usr/bin/env bash
# Call F: two Q tiles for dense calls only (packed calls keep one), the table's persistent entries up to 4k: GPU tests of
# what the forward reaches (forward, varlen, launch plans, configs, API).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests forward 330 tests/test_forward_hopper.py tests/test_varlen.py tests/test_launch_plans.py tests/test_configs.py
run_tests api 200 tests/test_api.py
