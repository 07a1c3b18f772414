#!/usr/bin/env bash
# Call L: the Gluon dQ with three consumer warpgroups: its GPU tests, then the hdim-64 sweep.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu tests/test_dq_hopper.py -n 8 > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
SWEEPS=benchmarks/sweeps/dq-gluon-64-c3.txt LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -30
