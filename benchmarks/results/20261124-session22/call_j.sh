#!/usr/bin/env bash
# Call J: the final code (every persistent grid on the counter): GPU tests of the forward and launch plans, then the
# full ANCHORS grid with the SDPA providers.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
run_tests forward 200 tests/test_forward_hopper.py tests/test_launch_plans.py
export PYTHONPATH=src
timeout 360 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out "$OUT/bench" \
  --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
