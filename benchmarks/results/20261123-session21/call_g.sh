#!/usr/bin/env bash
# Call G: the rest of the GPU tests that the forward's changes reach (packed calls, launch plans, the dQ), then the
# short cells still behind the tutorial figures (sweep, twice).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests rest 230 tests/test_varlen.py tests/test_launch_plans.py tests/test_dq_hopper.py
SWEEPS=benchmarks/sweeps/forward-short-remaining.txt REPEAT=2 LIMIT=80 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      forward" | tail -40
