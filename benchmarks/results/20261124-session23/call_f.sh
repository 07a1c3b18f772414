#!/usr/bin/env bash
# Call F: batch 16 (one program an SM) unsplit with 4 stages (the new table: auto) against 2 splits of 3 stages;
# then the decode GPU tests.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
for round in 1 2; do
  timeout 80 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 65536 --batches 16 --splits 2 \
    --out "$OUT/b16-contiguous-$round.json" > "$OUT/b16-contiguous-$round.log" 2>&1
  echo "contiguous round $round exit $?"
  timeout 60 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 --batches 16 --splits 2 --page-size 256 \
    --out "$OUT/b16-paged-$round.json" > "$OUT/b16-paged-$round.log" 2>&1
  echo "paged round $round exit $?"
done
grep -h "^|" "$OUT"/b16-*.log
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_launch_plans.py tests/test_bench_decode.py
