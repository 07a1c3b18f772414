#!/usr/bin/env bash
# Call E: call D's packed non-causal failures under one change at a time (varlen_modes.py), one process a mode.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
for mode in tree q1 narrow static; do
  MODE=$mode timeout 120 python3 benchmarks/results/20261124-session22/varlen_modes.py 2>&1 | grep -v Warning | tail -8
done | tee "$OUT/varlen_modes.log"
