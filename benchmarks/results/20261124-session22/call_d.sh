#!/usr/bin/env bash
# Call D: the loader kept until the last tile's Q is released (the fix for call C's failures): GPU tests (forward with a
# packed case of 3-4 tiles a program, varlen, launch plans), call C's repeat check, then where persistent stops winning.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261124-session22
source benchmarks/gpu_tests.sh
run_tests forward 260 tests/test_forward_hopper.py tests/test_varlen.py tests/test_launch_plans.py
REPEAT=3 timeout 120 python3 $HERE/varlen_race.py 2>&1 | tee "$OUT/varlen_race.log" | grep -v Warning
SWEEPS=benchmarks/sweeps/forward-persistent-crossover.txt REPEAT=1 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      forward" | tail -40
