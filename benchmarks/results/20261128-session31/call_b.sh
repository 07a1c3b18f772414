#!/usr/bin/env bash
# Call B (H200, the final kernels): the decode GPU tests on the tree (the Gluon decode kernel shares forward_hopper's
# key loop, whose steps 38b6643 folded); one pass of the varlen bench; issue 3's decode grid without the 64k caches
# and batch 32 (the time left in the session's lease).
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 180 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 150 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --head-dims 128 \
  --seqlens 512 1024 16384 --varlen --out "$OUT/bench" --markdown "$OUT/bench/varlen.md" > "$OUT/bench-varlen.log" 2>&1
echo "varlen bench exit $?"
timeout 200 python3 -m flashattn bench --mode decode --cache-lens 4096 8192 16384 131072 --batches 1 4 8 16 64 \
  --out "$OUT/bench" --markdown "$OUT/bench/decode.md" > "$OUT/bench-decode.log" 2>&1
echo "decode bench exit $?"
grep "^|" "$OUT/bench/varlen.md" | tr -s ' '
grep "^|" "$OUT/bench/decode.md" | cut -d'|' -f2-4,9-10 | tr -s ' '
