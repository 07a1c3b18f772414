#!/usr/bin/env bash
# Call A: where the short calls' host time goes (benchmarks/host_breakdown.py), causal 512 at hdim 64/128/256 and
# hdim 128 non-causal 512.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nproc; lscpu | grep -E "Model name|MHz" | head -3
for hd in 128 64 256; do
  timeout 150 python3 benchmarks/host_breakdown.py --head-dim $hd --causal --calls 500 2>&1 | tee "$OUT/breakdown-$hd-causal.txt"
done
timeout 100 python3 benchmarks/host_breakdown.py --head-dim 128 --calls 500 2>&1 | tee "$OUT/breakdown-128.txt"
