#!/usr/bin/env bash
# Call D: the pipelined key-slice dK/dV, fourth form (counters, diagonal-only mask, unmasked statistics): the sweep
# (benchmarks/sweeps/dkdv-key-slices-pipelined-4.txt), then its GPU tests.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SWEEPS=benchmarks/sweeps/dkdv-key-slices-pipelined-4.txt REPEAT=1 LIMIT=120 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -30
source benchmarks/gpu_tests.sh
run_tests dkdv 200 -k slices tests/test_backward_hopper.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
