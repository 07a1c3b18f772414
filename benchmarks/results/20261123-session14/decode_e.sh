#!/usr/bin/env bash
# Call E: the decode bench on issue 3's grid (part 2), and the streaming launch against 3 splits on pages.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT/bench"
S=benchmarks/decode_splits.py
{
timeout 100 python3 $S --cache-lens 4096 16384 --batches 64 --page-size 256 --splits 1 3 --configs 64x4x3+nostream
timeout 60 python3 $S --cache-lens 4096 --batches 32 --splits 1 3 --configs 64x4x3+nostream
} > "$OUT/sweeps.log" 2>&1
grep "^|" "$OUT/sweeps.log" | cut -c1-200; grep -i "error\|Traceback" "$OUT/sweeps.log" | head -5
timeout 400 python3 -m flashattn bench --mode decode --cache-lens 4096 16384 131072 --batches 1 8 32 64 \
  --out "$OUT/bench" --markdown "$OUT/bench/decode-2.md" > "$OUT/bench-2.log" 2>&1
echo "bench exit $?"
cat "$OUT/bench/decode-2.md"
