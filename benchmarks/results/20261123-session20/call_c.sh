#!/usr/bin/env bash
# Call C: the 64-row rounding of the causal tiles (04681cf): the Gluon forward/dQ GPU tests, then the kernel-only
# forward A/B against session 19's file, ABBA order, hdim 64 forced onto the three-consumer tile.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261123-session20
source benchmarks/gpu_tests.sh
run_tests fwd 200 tests/test_forward_hopper.py tests/test_dq_hopper.py
REPEAT=4 timeout 300 python3 $HERE/fwd_ab.py $HERE/base_src/flashattn/kernels/forward_hopper.py 2>&1 | tee "$OUT/fwd_ab.log"
