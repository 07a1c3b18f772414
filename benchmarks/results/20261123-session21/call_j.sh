#!/usr/bin/env bash
# Call J: the final table (the Gluon dQ up to 1k at hdim 128) on the short cells: the bench at 512 / 1k tokens, every
# head dim, with the SDPA providers; then the GPU tests of the table's choices.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
timeout 200 python3 -m flashattn bench --seqlens 512 1024 --providers flashattn sdpa_flash sdpa_cudnn \
  --out "$OUT/bench" --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
run_tests table 120 tests/test_dq_hopper.py tests/test_configs.py tests/test_launch_plans.py
