#!/usr/bin/env bash
# Call B: the persistent Gluon forward takes causal / varlen tiles from a counter. GPU tests of the forward (and the
# dQ, which shares its tile plan), then the causal sweep against one program a tile and the table, twice.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests fwd 200 tests/test_forward_hopper.py tests/test_dq_hopper.py
SWEEPS=benchmarks/sweeps/forward-dynamic-tiles.txt REPEAT=2 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -80
