#!/usr/bin/env bash
# Call O: the final code (two splits past one wave over caches of 64k keys or more, calls M-N; the plain merge after
# a split Gluon step, call K): the GPU tests of every file that reaches the decode path, then the decode bench on
# issue 3's whole grid.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT/bench"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 170 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 260 python3 -m flashattn bench --mode decode --cache-lens 4096 8192 16384 65536 131072 \
  --batches 1 4 8 16 32 64 --out "$OUT/bench" --markdown "$OUT/bench/decode.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
cat "$OUT/bench/decode.md"
