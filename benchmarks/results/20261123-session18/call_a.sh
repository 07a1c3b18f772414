#!/usr/bin/env bash
# Call A: the software-pipelined key-slice Gluon dK/dV: its GPU tests (tests/test_backward_hopper.py), then the sweep
# against the table's Triton entries (benchmarks/sweeps/dkdv-key-slices-pipelined.txt), one pass.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
source benchmarks/gpu_tests.sh
run_tests dkdv 240 tests/test_backward_hopper.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
SWEEPS=benchmarks/sweeps/dkdv-key-slices-pipelined.txt REPEAT=1 LIMIT=120 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -40
