#!/usr/bin/env bash
# Call K (H200): the final code (the split rule with the peak memory bandwidth, the loader's constexprs): decode GPU tests,
# then issue 3's decode grid (contiguous and 256-key pages, against SDPA's backends).
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 170 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 330 python3 -m flashattn bench --mode decode --cache-lens 4096 8192 16384 65536 131072 \
  --batches 1 4 8 16 32 64 --out "$OUT/bench" --markdown "$OUT/bench/decode.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
grep "^|" "$OUT/bench/decode.md" | cut -d'|' -f2-4,9-10 | tr -s ' '
