#!/usr/bin/env bash
# Call I: grid G read the hdim-64 backward 3-7% under grid D (same backward code, another lease). An A/B of the two
# gradient streams on those cells, on G's lease, to see whether the overlap is what moved.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 200 python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS --rounds 3 --cases \
  64:4096:0 64:8192:1 64:2048:0 > "$OUT/ab.md" 2>&1
echo "ab exit $?"; cat "$OUT/ab.md"
