#!/usr/bin/env bash
# Call C: the pipelined key-slice dK/dV, dS from the fp32 P and the query blocks counted on (no division): the sweep
# (benchmarks/sweeps/dkdv-key-slices-pipelined-3.txt), then its GPU tests.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SWEEPS=benchmarks/sweeps/dkdv-key-slices-pipelined-3.txt REPEAT=1 LIMIT=120 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -16
source benchmarks/gpu_tests.sh
run_tests dkdv 200 -k slices tests/test_backward_hopper.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
