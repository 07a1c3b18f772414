#!/usr/bin/env bash
# Call A: the floor of a decode step (benchmarks/decode_read_floor.py: a launch that only reads the K/V bytes once,
# best of a sweep of configurations) next to flashattn and cuDNN; then the cells below cuDNN in session 25's grid,
# five alternating rounds each, to see each ratio's spread from round to round.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > "$OUT/gpu.txt"
timeout 260 python3 benchmarks/decode_read_floor.py --cache-lens 4096 8192 16384 --batches 1 4 16 \
  --json "$OUT/floor.json" > "$OUT/floor.log" 2>&1
echo "floor exit $?"
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 65536 --batches 16 --variants auto \
  --rounds 5 --append > "$OUT/ab-b16.log" 2>&1
echo "ab b16 exit $?"
timeout 60 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 --batches 32 --variants auto \
  --rounds 5 --append > "$OUT/ab-b32.log" 2>&1
echo "ab b32 exit $?"
grep "^|" "$OUT/floor.log"
grep "^|" "$OUT/ab-b16.log" "$OUT/ab-b32.log"
tail -3 "$OUT/floor.log"
