#!/usr/bin/env bash
# call A: the Gluon dQ's GPU tests, then its sweep
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m pytest -q -x tests/test_dq_hopper.py -n 8 -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests exit $?"; tail -25 $OUT/tests.log
SWEEPS=benchmarks/sweeps/dq-gluon.txt LIMIT=90 timeout 280 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -60
