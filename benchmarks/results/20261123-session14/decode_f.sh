#!/usr/bin/env bash
# Call F: split launches with a separate split for the masked blocks and the append (the table now)
# against the joint form; paged loops over chunks of the block table (pointer loads).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -m gpu tests/test_kvcache.py -k "forms or fused or split or paged" -n 8 > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
S=benchmarks/decode_splits.py
{
timeout 100 python3 $S --cache-lens 4096 8192 16384 --batches 1 --splits 16 32 --configs 64x4x3+joint
timeout 100 python3 $S --cache-lens 8192 --batches 4 16 --splits 2 8 --configs 64x4x3+joint
timeout 60 python3 $S --cache-lens 4096 --batches 8 --splits 4 --configs 64x4x3+joint
timeout 100 python3 $S --cache-lens 4096 8192 --batches 8 16 --page-size 256 --splits 2 4 --configs 64x4x3+c16 64x4x3+c16+joint
timeout 150 python3 $S --cache-lens 16384 --batches 32 64 --page-size 256 --splits 1 3 --configs 64x4x3+c16
timeout 60 python3 $S --cache-lens 4096 --batches 64 --page-size 256 --splits 1 3 --configs 64x4x3+c16
} > "$OUT/sweeps.log" 2>&1
grep "^|" "$OUT/sweeps.log" | cut -c1-200; grep -i "error\|Traceback" "$OUT/sweeps.log" | head -5
