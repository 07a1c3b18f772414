#!/usr/bin/env bash
# Call E (H200): equal-length packed calls, kernel before (d83fd7c, scratch/) against the tree's, ABBA: calls C-D's
# bench read equal-length causal 512 at 156-243 TFLOP/s (call J: 264), its backward too (unchanged code)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
CASES="128 1 512 0;128 0 512 0;128 1 1024 0;128 1 512 1;128 1 16384 1" ROUNDS=4 timeout 400 \
  python3 benchmarks/varlen_fwd_ab.py base=scratch/forward_hopper_d83fd7c.py new 2>&1 | tee "$OUT/ab.log"
