#!/usr/bin/env bash
# Call G: where a planned packed forward's host time goes at the bench's 512-token cells (the varlen cells under 90%
# of dense in call F), beside the dense call.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 200 python3 benchmarks/host_serving.py --calls 300 --breakdown 2>&1 | tee "$OUT/host_serving.log" | grep -v Warning
