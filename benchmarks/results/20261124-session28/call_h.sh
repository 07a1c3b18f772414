#!/usr/bin/env bash
# Call H (H200): the final rule (one Q tile where keys fill no block, causal or not, as c0978b2; call G found the
# causal and 200-key forms right with two): test_forward_hopper and test_varlen on the final code
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 400 tests/test_forward_hopper.py tests/test_varlen.py
