#!/usr/bin/env bash
# Call D: (1) kernel-only A/B of the forward's epilogue storing 8 contiguous elements a thread (variants/wide_stores.py:
# the tree's kernel with O converted to a blocked layout before its store) against the tree; (2) where the persistent
# causal forward takes over (sweep, twice).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261123-session21
CASES="128 1 512 128x64x8x2+ws+persistent;128 1 1024 128x128x8x2+ws+persistent;128 1 1024 128x64x8x2+ws+persistent;128 0 1024 128x128x8x2+ws+persistent;128 0 4096 128x128x8x2+ws;64 0 512 128x128x8x3+ws+consumers3+persistent;64 0 4096 128x128x8x3+ws+consumers3" \
  REPEAT=4 timeout 200 python3 benchmarks/fwd_ab.py wide=$HERE/variants/wide_stores.py 2>&1 | tee "$OUT/fwd_ab.log"
SWEEPS=benchmarks/sweeps/forward-dynamic-confirm.txt REPEAT=2 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      forward" | tail -60
