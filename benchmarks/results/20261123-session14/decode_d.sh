#!/usr/bin/env bash
# Call D: the kvcache GPU tests with the streaming launch, then the decode bench on issue 3's grid (part 1).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT/bench"
timeout 200 python3 -m pytest -q -m gpu tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py -n 8 \
  > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
timeout 330 python3 -m flashattn bench --mode decode --cache-lens 8192 65536 --batches 1 4 16 32 64 \
  --out "$OUT/bench" --markdown "$OUT/bench/decode-1.md" > "$OUT/bench-1.log" 2>&1
echo "bench exit $?"
cat "$OUT/bench/decode-1.md"
