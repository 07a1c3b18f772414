#!/usr/bin/env bash
# Call M (H200): the block-table lookups kept in L2 (evict_last), so that a next wave's program finds its first page
# there rather than in HBM: decode GPU tests; A/B against the kernel before ("+base", carried in scratch/), five rounds,
# paged steps of one to four waves.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --variants auto auto+base --rounds 5 --append \
  --base-kernel scratch/decode_hopper_dd07d67.py --cache-lens 4096 8192 --batches 16 32 64 --page-size 256 \
  > "$OUT/paged.log" 2>&1
echo "paged exit $?"
grep "^| [0-9]" "$OUT/paged.log" | cut -d'|' -f2-3,5-10
