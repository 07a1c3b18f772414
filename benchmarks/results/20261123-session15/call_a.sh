#!/usr/bin/env bash
# Call A: where the hdim-64 backward's time goes (kernel split), then the occupancy sweep.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > "$OUT/env.txt"
timeout 120 python3 benchmarks/backward_profile.py --head-dims 64 --seqlens 2048 16384 --causal 0 1 > "$OUT/profile.md" 2>&1
SWEEPS=benchmarks/sweeps/occupancy.txt LIMIT=200 bash benchmarks/gpu_sweeps.sh > "$OUT/sweeps.txt" 2>&1
cat "$OUT/env.txt"; cat "$OUT/profile.md" | tail -25; tail -60 "$OUT/sweeps.txt"
