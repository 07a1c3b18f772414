#!/usr/bin/env bash
# Call A: where the short causal hdim-128 forward's time goes. ncu on the table's Triton tile and the Gluon forward
# (persistent and not) at causal 1k, then the six-cell sweep file once.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
timeout 200 python3 benchmarks/ncu_compare.py --kernel regex:attention_forward \
  --case triton:hdim=128,seqlen=1024,causal=1,forward=64x64x4x3 \
  --case persistent:hdim=128,seqlen=1024,causal=1,forward=128x128x8x3+ws+persistent \
  --case gluon:hdim=128,seqlen=1024,causal=1,forward=128x128x8x2+ws 2>&1 | tee "$OUT/ncu.log" | head -120
SWEEPS=benchmarks/sweeps/forward-short-cells.txt REPEAT=1 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -40
