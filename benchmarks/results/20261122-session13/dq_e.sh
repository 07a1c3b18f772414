#!/usr/bin/env bash
# call E (final HEAD, after the loader refactor): the GPU files not run this session, and the float32 tests of the
# backward-reaching ones that fit the budget
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -m pytest -q tests/test_forward_hopper.py tests/test_dq_hopper.py tests/test_launcher.py tests/test_varlen_paged.py tests/test_kvcache.py tests/test_combine.py tests/test_sdpa_override.py tests/test_blocks.py tests/test_bench.py tests/test_bench_decode.py tests/test_demo_cli.py tests/test_measure.py tests/test_iomeasure.py -n 16 -p no:cacheprovider -k "not test_gpu_ncu" > $OUT/tests.log 2>&1
echo "tests exit $?"; grep -E "passed|failed|FAILED|^ERROR" $OUT/tests.log | tail -15
timeout 200 python3 -m pytest -q tests/test_varlen.py tests/test_api.py tests/test_sdpa.py tests/test_nn.py -k "float32" -n 16 -p no:cacheprovider > $OUT/tests-fp32.log 2>&1
echo "fp32 tests exit $?"; grep -E "passed|failed|FAILED|^ERROR" $OUT/tests-fp32.log | tail -10
