#!/usr/bin/env bash
# Call K: a second full ANCHORS grid (the run-to-run spread of call F's two missed forward cells) (flashattn, sdpa_flash, sdpa_cudnn) at 05cfc01: the concurrent dK/dV and dQ kernels and
# the 512-token causal hdim-128 forward tile.
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True FLASHATTN_COMMIT=59a688c
mkdir -p $OUT/bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 560 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out $OUT/bench \
  --markdown $OUT/bench/grid.md --plot $OUT/bench/bench.png > $OUT/bench/bench.log 2>&1
echo "bench exit $?"
cat $OUT/bench/grid.md
