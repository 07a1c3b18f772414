#!/usr/bin/env bash
# Call B: kernel-only A/B of the Gluon forward (session 19's file against the tree's), interleaved.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261123-session20
REPEAT=4 timeout 400 python3 $HERE/fwd_ab.py $HERE/base_src/flashattn/kernels/forward_hopper.py 2>&1 | tee "$OUT/fwd_ab.log"
