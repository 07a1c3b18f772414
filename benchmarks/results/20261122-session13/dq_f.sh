#!/usr/bin/env bash
# call F (final HEAD, after the host-side mend): the Gluon kernels' test files and the varlen backward, 16-bit
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -m pytest -q tests/test_dq_hopper.py tests/test_backward_hopper.py tests/test_forward_hopper.py tests/test_varlen.py tests/test_launcher.py "tests/test_kernels.py::test_one_query_causal_backward_at_hdim_64" -k "not float32" -n 16 -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests exit $?"; grep -E "passed|failed|FAILED|^ERROR" $OUT/tests.log | tail -15
