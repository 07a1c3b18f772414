#!/usr/bin/env bash
# Call K: key slices over the warps (each warp its own softmax state) against the table; GPU tests of the form.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -m gpu tests/test_kvcache.py -k "forms" -n 8 > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
S=benchmarks/decode_splits.py
C="64x4x3+w4 128x8x2+w8"
{
timeout 150 python3 $S --cache-lens 4096 8192 16384 65536 --batches 1 --splits 16 32 --configs $C
timeout 100 python3 $S --cache-lens 8192 --batches 4 16 --splits 8 2 --configs $C
timeout 100 python3 $S --cache-lens 4096 --batches 8 16 --splits 4 2 --configs $C
timeout 100 python3 $S --cache-lens 4096 16384 --batches 64 --splits 1 --configs $C
} > "$OUT/sweeps.log" 2>&1
grep "^|" "$OUT/sweeps.log" | cut -c1-200; grep -i "error\|Traceback\|WRONG" "$OUT/sweeps.log" | head -5
