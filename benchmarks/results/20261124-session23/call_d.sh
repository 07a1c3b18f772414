#!/usr/bin/env bash
# Call D: the L2 prefetch of the tail block (table) against none (+noprefetch), auto split count, twice; the kvcache
# GPU tests; then the decode bench on the small and middle batches with SDPA in the same run.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
run_tests kvcache 150 tests/test_kvcache.py tests/test_bench_decode.py
export PYTHONPATH=src
S=benchmarks/results/20261124-session23
for round in 1 2; do
  timeout 100 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 65536 --batches 1 2 4 8 16 32 \
    --configs 64x4x3+noprefetch --auto-only --out "$OUT/ab-contiguous-$round.json" > "$OUT/ab-contiguous-$round.log" 2>&1
  echo "contiguous round $round exit $?"
done
python3 $S/ab_summary.py "$OUT"/ab-contiguous-*.json
timeout 150 python3 -m flashattn bench --mode decode --cache-lens 4096 8192 16384 --batches 1 4 16 \
  --out "$OUT/bench" --markdown "$OUT/decode.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
cat "$OUT/decode.md"
