#!/usr/bin/env bash
# call C: the full ANCHORS grid with the Gluon dQ (flashattn, sdpa_flash, sdpa_cudnn), then flex on the backward
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p $OUT/bench $OUT/flex
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out $OUT/bench \
  --markdown $OUT/bench/grid.md --plot $OUT/bench/bench.png > $OUT/bench/bench.log 2>&1
echo "bench exit $?"
cat $OUT/bench/grid.md
timeout 230 python3 -m flashattn bench --providers flashattn flex --head-dims 128 256 --seqlens 1024 4096 16384 \
  --modes bwd --out $OUT/flex --markdown $OUT/flex/flex.md > $OUT/flex/flex.log 2>&1
echo "flex exit $?"
cat $OUT/flex/flex.md
