#!/usr/bin/env bash
# Call B: the per-tile cost data (tile_costs.py: equal-length packed and dense calls over whole and partial tiles),
# and what the masked last key block costs packed calls: 4601e33's kernel against the same with the last blocks
# unmasked (wrong outputs on partial blocks, timing only), kernel-only A/B on mixed lengths.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
S=benchmarks/results/20261124-session30
timeout 200 python3 $S/tile_costs.py > "$OUT/tile-costs.log" 2>&1
echo "tile costs exit $?"; cat "$OUT/tile-costs.log"
CASES="128 0 512 1;128 0 1024 1" ROUNDS=4 timeout 200 python3 benchmarks/varlen_fwd_ab.py new \
  tailunmasked=scratch/fwd_tail_unmasked.py > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
