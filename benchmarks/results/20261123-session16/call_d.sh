#!/usr/bin/env bash
# Call D: the full ANCHORS grid with launch plans on (flashattn, sdpa_flash, sdpa_cudnn), with host times.
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True FLASHATTN_COMMIT=4a7803d
mkdir -p $OUT/bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 560 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out $OUT/bench \
  --markdown $OUT/bench/grid.md --plot $OUT/bench/bench.png > $OUT/bench/bench.log 2>&1
echo "bench exit $?"
cat $OUT/bench/grid.md
