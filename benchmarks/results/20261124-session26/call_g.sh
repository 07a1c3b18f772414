#!/usr/bin/env bash
# Call G (H100): one swapped consumer against two (main) on one-wave and two-wave steps, contiguous and paged, and
# two splits at batch 16; five alternating rounds.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpu.txt"
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 8 16 32 \
  --variants auto auto+c1 --rounds 5 --append > "$OUT/ab.log" 2>&1
echo "ab exit $?"
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 16 32 --variants auto auto+c1 \
  --rounds 5 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^| [0-9]" "$OUT/ab.log" "$OUT/ab-paged.log"
