#!/usr/bin/env bash
# Call B: a second Q tile on persistent grids in the tree (ops._forward_q_buffers): GPU tests (forward, launch plans),
# then where the persistent Gluon forward should take over (sweep, once).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests forward 200 tests/test_forward_hopper.py tests/test_launch_plans.py
SWEEPS=benchmarks/sweeps/forward-double-q.txt REPEAT=1 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      forward" | tail -60
