#!/usr/bin/env bash
# Call C (H200): the dense builds under the fold. 38b6643 changed no dense step, but the builds' SASS moved (the same
# instruction counts, registers renamed and a few mask instructions reordered: scratch/sass_compare.py on the CPU):
# kernel-only A/B of the tree's kernel against 08f8add's file (scratch/) on the table's tiles.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
CASES="128 0 512 table;128 0 4096 table;128 1 16384 table;64 0 4096 table;64 1 4096 table" REPEAT=3 timeout 230 \
  python3 benchmarks/fwd_ab.py unfolded=scratch/forward_hopper_08f8add.py 2>&1 | tee "$OUT/fwd-ab.log"
