#!/usr/bin/env bash
# Call I: the fused append with its loads before the key loop; decode GPU tests and the small-batch grid.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT/bench"
timeout 150 python3 -m pytest -q -m gpu tests/test_kvcache.py tests/test_combine.py -n 8 > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
timeout 300 python3 -m flashattn bench --mode decode --cache-lens 4096 8192 16384 --batches 1 4 8 16 \
  --out "$OUT/bench" --markdown "$OUT/bench/decode.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
cat "$OUT/bench/decode.md"
