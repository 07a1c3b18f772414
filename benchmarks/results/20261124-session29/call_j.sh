#!/usr/bin/env bash
# Call J: the one-run kernel with its first block always masked (no branch: the loop's state in the two-run order)
# against the kernel before (a8b2126's file in scratch/): dense on the table's tiles, packed as the bench lays out.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
S=benchmarks/results/20261124-session29
CASES="64 0 4096 128x128x8x3+ws+consumers3+persistent;64 1 4096 128x128x8x3+ws+consumers3+persistent;128 0 512 128x128x8x2+ws+persistent;128 1 512 128x64x8x3+ws+persistent;128 1 16384 128x128x8x3+ws;128 0 4096 128x128x8x2+ws+persistent;64 1 16384 128x128x8x3+ws+consumers3;64 0 1024 128x128x8x3+ws+consumers3+persistent" \
  REPEAT=4 timeout 300 python3 benchmarks/fwd_ab.py base=scratch/forward_hopper_head.py > "$OUT/fwd-ab.log" 2>&1
echo "fwd_ab exit $?"; cat "$OUT/fwd-ab.log"
CASES="128 0 512 1;128 1 16384 1;64 0 512 1" ROUNDS=3 \
  timeout 200 python3 benchmarks/varlen_fwd_ab.py base=scratch/forward_hopper_head.py+qb1 new new+p2 \
  > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
