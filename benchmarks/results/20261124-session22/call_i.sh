#!/usr/bin/env bash
# Call I: dense non-causal persistent grids, static tile order against tiles from the counter (ab_counter.py).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
REPEAT=4 timeout 300 python3 benchmarks/results/20261124-session22/ab_counter.py 2>&1 | grep -v Warning | tee "$OUT/ab_counter.log"
