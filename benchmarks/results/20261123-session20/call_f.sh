#!/usr/bin/env bash
# Call F: the Triton dQ's causal query blocks longest first (3557caa). GPU tests of the Triton kernels, then the whole
# backward A/B against the dQ kernel before the change (variants/backward_before.py, 4938753), alternating.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261123-session20
source benchmarks/gpu_tests.sh
run_tests kernels 170 tests/test_kernels.py tests/test_varlen.py
timeout 300 python3 benchmarks/ab_flag.py --flag flashattn.kernels.backward:dq_kernel \
  --off-from $HERE/variants/backward_before.py --cases 64:2048:1 64:4096:1 64:8192:1 64:16384:1 64:4096:0 \
  --mode bwd --rounds 4 2>&1 | tee "$OUT/dq_order_ab.md"
