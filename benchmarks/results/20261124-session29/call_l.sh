#!/usr/bin/env bash
# Call L (final code): the varlen bench twice; hdim 64 packed long calls on the persistent grid (the tree's rule
# since _PACKED_KEEP_PERSISTENT) against the long table's one program a tile (+t3c3).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT/bench"
for pass in 1 2; do
  timeout 150 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --head-dims 128 \
    --seqlens 512 1024 16384 --varlen --out "$OUT/bench" --markdown "$OUT/bench/varlen-pass$pass.md" > "$OUT/bench-$pass.log" 2>&1
  echo "bench pass $pass exit $?"; cat "$OUT/bench/varlen-pass$pass.md"
done
CASES="64 1 16384 1;64 0 16384 1;64 1 16384 0" ROUNDS=3 timeout 150 python3 benchmarks/varlen_fwd_ab.py new new+t3c3 \
  > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
