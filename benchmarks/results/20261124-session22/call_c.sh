#!/usr/bin/env bash
# Call C: the packed non-causal failures of call B: the tree (two Q buffers), the tree with one, and the loader kept
# until the last tile's Q is released (variants/loader_stays.py), each case 5 times.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
HERE=benchmarks/results/20261124-session22
REPEAT=5 timeout 400 python3 $HERE/varlen_race.py stays=$HERE/variants/loader_stays.py 2>&1 | tee "$OUT/varlen_race.log" | grep -v Warning
