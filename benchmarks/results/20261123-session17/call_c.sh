#!/usr/bin/env bash
# Call C: where a planned decode step's host time goes (benchmarks/host_serving.py --breakdown).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 200 python3 benchmarks/host_serving.py --calls 300 --breakdown 2>&1 | tee "$OUT/host_serving.log" | grep -v Warning
