#!/usr/bin/env bash
# call G (after the key_ring / tile-plan mend): the Gluon kernels' tests and the varlen backward, then a timing check
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -m pytest -q tests/test_dq_hopper.py tests/test_forward_hopper.py tests/test_backward_hopper.py tests/test_varlen.py -k "not float32 and not 128_keys" -n 16 -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests exit $?"; grep -E "passed|failed|FAILED|^ERROR" $OUT/tests.log | tail -15
SWEEPS=benchmarks/sweeps/ring-mend.txt LIMIT=60 timeout 200 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -E "^flashattn|^ +(forward|dq) [0-9]|exit"
