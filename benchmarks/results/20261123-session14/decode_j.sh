#!/usr/bin/env bash
# Call J: GPU tests of every file that reaches the decode path, then the decode bench on issue 3's whole grid
# (final decode code).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT/bench"
timeout 200 python3 -m pytest -q -m gpu tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py \
  tests/test_api.py -n 12 > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
timeout 330 python3 -m flashattn bench --mode decode --cache-lens 4096 8192 16384 65536 131072 \
  --batches 1 4 8 16 32 64 --out "$OUT/bench" --markdown "$OUT/bench/decode.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
cat "$OUT/bench/decode.md"
