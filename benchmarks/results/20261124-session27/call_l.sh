#!/usr/bin/env bash
# Call L (H200): the loader's block lookups three blocks ahead instead of one (a paged lookup whose block-table line
# left the caches waits behind three blocks' copies): decode GPU tests; A/B against the one-ahead loader ("+base",
# the kernel file before, carried in scratch/), five rounds, paged steps and one contiguous control.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
run() {  # name, limit, then decode_gluon_ab arguments
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 benchmarks/decode_gluon_ab.py --variants auto auto+base --rounds 5 --append \
    --base-kernel scratch/decode_hopper_lookahead1.py "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
run paged 150 --cache-lens 4096 8192 --batches 4 16 32 --page-size 256
run paged-long 120 --cache-lens 65536 --batches 16 --page-size 256
run contiguous-long 100 --cache-lens 65536 --batches 16
for name in paged paged-long contiguous-long; do echo "## $name"; grep "^| [0-9]" "$OUT/$name.log" | cut -d'|' -f2-3,5-10; done
