#!/usr/bin/env bash
# Call H: Nsight Compute on the dK/dV kernels of the hdim-64 backward (session 18's table on main): the key-slice
# Gluon kernel against the Triton tile, at 2k non-causal and 8k causal: stall reasons, issue use, per-SM balance.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 280 python3 benchmarks/ncu_compare.py --kernel regex:dkdv \
  --case triton-2k:hdim=64,seqlen=2048,mode=bwd,dkdv=64x64x4x3+keyrows \
  --case slices-2k:hdim=64,seqlen=2048,mode=bwd,dkdv=64x128x8x3+ws+slices > "$OUT/ncu-2k.md" 2>&1
echo "2k exit $?"; cat "$OUT/ncu-2k.md" | head -60
timeout 250 python3 benchmarks/ncu_compare.py --kernel regex:dkdv \
  --case triton-c8k:hdim=64,seqlen=8192,causal=1,mode=bwd,dkdv=64x64x4x3+every+keyrows+peel \
  --case slices-c8k:hdim=64,seqlen=8192,causal=1,mode=bwd,dkdv=64x128x8x3+ws+slices > "$OUT/ncu-c8k.md" 2>&1
echo "c8k exit $?"; cat "$OUT/ncu-c8k.md" | head -40
