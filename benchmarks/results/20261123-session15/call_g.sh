#!/usr/bin/env bash
# Call G: the forward sweep of call F's two missed cells, twice.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SWEEPS=benchmarks/sweeps/forward-causal-64-256.txt REPEAT=2 LIMIT=200 bash benchmarks/gpu_sweeps.sh > "$OUT/sweeps.txt" 2>&1
grep -E "^flashattn|^ +(forward|dkdv|dq) [0-9]|^exit" "$OUT/sweeps.txt"
