#!/usr/bin/env bash
# Call C: decode programs of one and two warps (no cross-warp softmax in the key loop), against the table.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
S=benchmarks/decode_splits.py
C="64x1x3+ptr 64x1x3+tma 64x2x3+tma 32x1x4+tma 64x1x4+tma 64x4x4+ptr"
{
timeout 120 python3 $S --cache-lens 8192 --batches 1 --splits 16 32 64 --configs $C
timeout 100 python3 $S --cache-lens 8192 --batches 4 --splits 8 16 --configs $C
timeout 100 python3 $S --cache-lens 4096 --batches 8 --splits 4 8 --configs $C
timeout 150 python3 $S --cache-lens 4096 --batches 64 --splits 1 3 --configs $C
timeout 150 python3 $S --cache-lens 65536 --batches 16 --splits 1 2 --configs $C
} > "$OUT/sweeps.log" 2>&1
grep "^|" "$OUT/sweeps.log" | cut -c1-200; grep -i "error\|Traceback" "$OUT/sweeps.log" | head -5
