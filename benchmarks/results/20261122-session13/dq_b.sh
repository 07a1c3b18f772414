#!/usr/bin/env bash
# call B: the Gluon dQ in the table: its tests and the backward-reaching files (16-bit), then the short sweep
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -m pytest -q tests/test_dq_hopper.py tests/test_backward_hopper.py tests/test_varlen.py tests/test_api.py "tests/test_kernels.py::test_one_query_causal_backward_at_hdim_64" -k "not float32" -n 16 -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests exit $?"; grep -E "passed|failed|FAILED|Error" $OUT/tests.log | tail -15
SWEEPS=benchmarks/sweeps/dq-gluon-short.txt LIMIT=60 timeout 240 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -E "^flashattn|^ +dq [0-9]|exit"
