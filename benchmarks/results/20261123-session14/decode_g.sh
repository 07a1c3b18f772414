#!/usr/bin/env bash
# Call G: A/B of the separate tail split (small batches) and of the chunked block-table loop (pages).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
S=benchmarks/decode_splits.py
{
timeout 150 python3 $S --cache-lens 4096 8192 16384 65536 --batches 1 --splits 8 15 16 32 --configs 64x4x3+joint
timeout 100 python3 $S --cache-lens 8192 65536 --batches 2 --splits 7 8 16 --configs 64x4x3+joint
timeout 100 python3 $S --cache-lens 8192 --batches 4 16 --configs 64x4x3+joint --splits 2 8
timeout 150 python3 $S --cache-lens 8192 --batches 4 16 --page-size 256 --splits 2 8 --configs 64x4x3+joint 64x4x3+c16+joint
timeout 150 python3 $S --cache-lens 4096 16384 --batches 8 --page-size 256 --splits 4 --configs 64x4x3+joint 64x4x3+c16+joint
timeout 100 python3 $S --cache-lens 65536 --batches 4 --page-size 256 --splits 8 --configs 64x4x3+joint 64x4x3+c16+joint
} > "$OUT/sweeps.log" 2>&1
grep "^|" "$OUT/sweeps.log" | cut -c1-200; grep -i "error\|Traceback" "$OUT/sweeps.log" | head -5
