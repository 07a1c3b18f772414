#!/usr/bin/env bash
# Call G: after the review mend of the key-slice kernel (one offset expression, the end-of-walk test derived from the
# wrap; sm90 loop instruction counts unchanged): its GPU tests and the table's backward calls.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests mend 300 tests/test_backward_hopper.py tests/test_api.py tests/test_launch_plans.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
