#!/usr/bin/env bash
# Call C: call B again after the launch plans learnt to zero the tile counter on replay (launcher.zeros).
# tests of the launch plans, then the causal sweep twice.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests fwd 200 tests/test_forward_hopper.py tests/test_launch_plans.py
SWEEPS=benchmarks/sweeps/forward-dynamic-tiles.txt REPEAT=2 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -80
