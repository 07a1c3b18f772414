#!/usr/bin/env bash
# Call J: the hdim-64 backward's tiles (benchmarks/sweeps/backward-64-wide.txt, once).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
SWEEPS=benchmarks/sweeps/backward-64-wide.txt REPEAT=1 LIMIT=150 timeout 500 bash benchmarks/gpu_sweeps.sh
