#!/usr/bin/env bash
# call D: the 16-bit tests of the other backward-reaching files with the Gluon dQ in the table, then hdim-64 sweep
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 400 python3 -m pytest -q tests/test_kernels.py tests/test_sdpa.py tests/test_nn.py tests/test_compile.py tests/test_transformers.py tests/test_dkdv_loops.py tests/test_dkdv_split.py tests/test_memory.py tests/test_mask_skip.py -k "not float32" -n 16 -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests exit $?"; grep -E "passed|failed|FAILED|^ERROR" $OUT/tests.log | tail -15
SWEEPS=benchmarks/sweeps/dq-gluon-64.txt LIMIT=60 timeout 150 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -E "^flashattn|^ +dq [0-9]|exit"
