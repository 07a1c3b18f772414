#!/usr/bin/env bash
# Call L: the full ANCHORS grid with the kernels compiled ahead (bench.compile_ahead) (flashattn, sdpa_flash, sdpa_cudnn) at 05cfc01: the concurrent dK/dV and dQ kernels and
# the 512-token causal hdim-128 forward tile.
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True FLASHATTN_COMMIT=6f790e3
mkdir -p $OUT/bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 560 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out $OUT/bench \
  --markdown $OUT/bench/grid.md --plot $OUT/bench/bench.png > $OUT/bench/bench.log 2>&1
echo "bench exit $?"
cat $OUT/bench/grid.md
