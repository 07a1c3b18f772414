#!/usr/bin/env bash
# Call F: the table takes version 22's forward (persistent grids up to 1k tokens at every head dim, causal hdim 128
# up to 8k). The full grid in one run with the SDPA providers, then GPU tests of the forward and the public API.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
timeout 320 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out "$OUT/bench" \
  --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
run_tests fwd 220 tests/test_forward_hopper.py tests/test_api.py tests/test_configs.py
