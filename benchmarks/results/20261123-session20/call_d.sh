#!/usr/bin/env bash
# Call D: P rounded two elements an instruction in the Gluon forward (c987b3b): the forward's GPU tests, then the
# kernel-only A/B: session 19's file (base), the 64-row-rounded causal tiles alone (aligned, 04681cf), the tree (new).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261123-session20
source benchmarks/gpu_tests.sh
run_tests fwd 200 tests/test_forward_hopper.py tests/test_api.py
REPEAT=4 timeout 330 python3 $HERE/fwd_ab.py base=$HERE/base_src/flashattn/kernels/forward_hopper.py \
  aligned=$HERE/variants/aligned.py 2>&1 | tee "$OUT/fwd_ab.log"
