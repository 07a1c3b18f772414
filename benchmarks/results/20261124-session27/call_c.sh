#!/usr/bin/env bash
# Call C (H200): the final rule (the partitions read the length, split 0's first block early, in launches of up to 4
# splits): decode GPU tests; batch 3 (5 splits, late by the rule) against early; issue 3's decode grid.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 60 python3 benchmarks/decode_gluon_ab.py --variants auto auto+early --rounds 5 --append --cache-lens 4096 16384 \
  --batches 3 > "$OUT/batch3.log" 2>&1
echo "batch3 exit $?"
timeout 330 python3 -m flashattn bench --mode decode --cache-lens 4096 8192 16384 65536 131072 \
  --batches 1 4 8 16 32 64 --out "$OUT/bench" --markdown "$OUT/bench/decode.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
grep "^| [0-9]" "$OUT/batch3.log" | cut -d'|' -f2-3,5-10
grep "^|" "$OUT/bench/decode.md" | cut -d'|' -f2-4,9-10 | tr -s ' '
