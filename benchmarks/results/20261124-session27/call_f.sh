#!/usr/bin/env bash
# Call F (H100): which ring depth faulted in call E (an unspecified launch failure at 4k batch 16), and whether with
# the length read before the partitions (+late) too: each variant in its own process, one round.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
for variant in 64x4+early 64x5+late 64x5+early 64x6+late 64x6+early 64x3+early; do
  timeout 60 python3 benchmarks/decode_gluon_ab.py --variants "$variant" --rounds 1 --append --cache-lens 4096 \
    --batches 16 > "$OUT/$variant.log" 2>&1
  echo "$variant exit $?: $(grep -v CUDAEvent "$OUT/$variant.log" | grep -E '^\| 4096|Error' | head -2 | tr '\n' ' ')"
done
