#!/usr/bin/env bash
# Call M: short mixed packed calls on 64-key blocks (half the key blocks' padding at a sequence's end) against the
# table's 128-key tile.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
CASES="128 0 512 1;128 1 512 1;128 0 1024 1;128 0 512 0" ROUNDS=3 timeout 280 \
  python3 benchmarks/varlen_fwd_ab.py new new+k64s3 new+k64s4 > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
