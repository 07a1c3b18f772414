#!/usr/bin/env bash
# Call K: the GPU tests of the whole backward (its Gluon dQ stores dQ 16 bytes a thread since call H) and of the
# public API on the final code.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests backward 210 tests/test_backward_hopper.py tests/test_api.py
