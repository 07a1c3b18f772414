#!/usr/bin/env bash
# Call E: the forward's 16-byte stores (where shared memory leaves room) in the tree, the dQ's store through the same
# helper. GPU tests of the forward and the dQ, then the short / middle cells' tiles (sweep, twice).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests fwd 200 tests/test_forward_hopper.py tests/test_dq_hopper.py
SWEEPS=benchmarks/sweeps/forward-wide-stores.txt REPEAT=2 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      forward" | tail -60
