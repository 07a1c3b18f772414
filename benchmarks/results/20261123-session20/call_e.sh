#!/usr/bin/env bash
# Call E: the session's final kernels. GPU tests of the backward (the key-slice barrier cleanup), launch plans and
# varlen (the forward's tile plan), then the full ANCHORS grid in one run against SDPA, with the figure.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests bwd 230 tests/test_backward_hopper.py tests/test_launch_plans.py tests/test_varlen.py
timeout 300 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out "$OUT/bench" \
  --markdown "$OUT/grid.md" --plot "$OUT/bench-h200.png" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; grep -B2 -A9 "hdim 64, causal" "$OUT/grid.md" | tail -12
