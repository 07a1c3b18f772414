#!/usr/bin/env bash
# Call E: packed calls' tile options at short mixed lengths (ping-pong turns between the consumers, three stages)
# against the table's tile, kernel-only; the host time of dense and packed calls at 128-512 tokens a sequence.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
S=benchmarks/results/20261124-session30
timeout 90 python3 $S/host_time.py > "$OUT/host-time.log" 2>&1
echo "host time exit $?"; cat "$OUT/host-time.log"
CASES="128 0 512 1;128 0 1024 1;128 0 512 0;128 0 128 0" ROUNDS=3 timeout 250 python3 benchmarks/varlen_fwd_ab.py new \
  new@128x128x8x2+ws+persistent+pingpong new@128x128x8x3+ws+persistent > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; cat "$OUT/varlen-ab.log"
