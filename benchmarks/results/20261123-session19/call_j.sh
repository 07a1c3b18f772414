#!/usr/bin/env bash
# Call J: the final code (one barrier frees a key-slice stage): the backward's GPU tests, then the backward grid at
# hdim 64 and 128 against SDPA.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests bwd 170 tests/test_backward_hopper.py tests/test_api.py tests/test_launch_plans.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
timeout 200 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --head-dims 64 128 --modes bwd \
  --out "$OUT/bench" --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; grep -E "^d(64|128)" "$OUT/bench.log" | head -40; tail -30 "$OUT/grid.md"
