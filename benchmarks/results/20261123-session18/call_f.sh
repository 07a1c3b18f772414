#!/usr/bin/env bash
# Call F: the table after call E's sweep (key slices at hdim 64 and 128 without a mask, from 2k; causal back on the
# Triton tiles): the backward grid at hdim 64 and 128 against SDPA, then the GPU tests of the files whose calls take
# the table's backward.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
timeout 200 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --head-dims 64 128 --modes bwd \
  --out "$OUT/bench" --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; grep -E "^d(64|128) .*(flashattn|sdpa_flash) " "$OUT/bench.log" | grep -v "n=512 " | awk '{print $1, $2, $3, $4, $8}'
source benchmarks/gpu_tests.sh
run_tests table 280 tests/test_backward_hopper.py tests/test_api.py tests/test_launch_plans.py tests/test_nn.py \
  tests/test_sdpa.py tests/test_dq_hopper.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
