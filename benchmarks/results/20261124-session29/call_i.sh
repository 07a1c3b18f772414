#!/usr/bin/env bash
# Call I: the one-run kernel against the kernel before (a8b2126's file, carried in scratch/), kernel-only: dense
# calls on the table's tiles (fwd_ab.py), and packed calls as before (old kernel, one Q tile: base+qb1) against the
# tree (two Q tiles) and the tree on the persistent 2-stage tile (+p2); then the two-Q check on the tree's rule.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
S=benchmarks/results/20261124-session29
timeout 60 python3 $S/q_tiles_check.py 2>&1 | tail -1
CASES="128 1 512 128x64x8x3+ws+persistent;128 0 512 128x128x8x2+ws+persistent;128 1 2048 128x128x8x2+ws+persistent;128 0 4096 128x128x8x2+ws+persistent;128 1 4096 128x128x8x2+ws+persistent;128 1 16384 128x128x8x3+ws;64 0 4096 128x128x8x3+ws+consumers3+persistent;64 1 4096 128x128x8x3+ws+consumers3+persistent" \
  REPEAT=3 timeout 250 python3 benchmarks/fwd_ab.py base=scratch/forward_hopper_head.py > "$OUT/fwd-ab.log" 2>&1
echo "fwd_ab exit $?"; cat "$OUT/fwd-ab.log"
CASES="128 0 512 1;128 1 512 1;128 0 1024 1;128 1 1024 1;128 0 16384 1;128 1 16384 1;64 0 512 1" ROUNDS=3 \
  timeout 230 python3 benchmarks/varlen_fwd_ab.py base=scratch/forward_hopper_head.py+qb1 new new+p2 \
  > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
