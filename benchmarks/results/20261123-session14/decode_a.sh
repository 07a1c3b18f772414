#!/usr/bin/env bash
# Call A: TMA decode loads. GPU tests of the forced TMA path, then split/config sweeps against the table's
# pointer loads (contiguous and 256-token pages). Run from the repo root on the device.
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1
timeout 200 python3 -m pytest -q -m gpu tests/test_kvcache.py -k tma -n 8 > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
S=benchmarks/decode_splits.py
C="64x4x3+tma 64x4x4+tma 128x4x3+tma"
P="64x4x3+tma 64x4x3+c16 64x4x4+c16"
{
timeout 100 python3 $S --cache-lens 8192 16384 --batches 1 --splits 16 32 --configs $C
timeout 100 python3 $S --cache-lens 8192 --batches 4 --splits 8 16 --configs $C
timeout 100 python3 $S --cache-lens 4096 --batches 8 --splits 4 8 --configs $C
timeout 150 python3 $S --cache-lens 4096 16384 --batches 64 --splits 1 3 4 --configs $C
timeout 100 python3 $S --cache-lens 65536 --batches 16 --splits 1 3 --configs $C
timeout 100 python3 $S --cache-lens 8192 --batches 4 --page-size 256 --splits 8 16 --configs $P
timeout 100 python3 $S --cache-lens 4096 --batches 8 --page-size 256 --splits 4 8 --configs $P
timeout 100 python3 $S --cache-lens 16384 --batches 64 --page-size 256 --splits 1 3 --configs $P
} > "$OUT/sweeps.log" 2>&1
grep "^|" "$OUT/sweeps.log" | cut -c1-220; grep -i "error\|Traceback" "$OUT/sweeps.log" | head -5
