#!/usr/bin/env bash
# Call A: split 0's first block copied before the sequence's length arrives (each partition reads the length itself):
# decode GPU tests, then A/B against the kernel before (f017e8f, "+base"), contiguous and 256-key pages, five rounds.
# The base kernel file travels in scratch/ (git show f017e8f:src/flashattn/kernels/decode_hopper.py).
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 170 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
run() {  # name, limit, then decode_gluon_ab arguments
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 benchmarks/decode_gluon_ab.py --variants auto auto+base --rounds 5 --append \
    --base-kernel scratch/decode_hopper_f017e8f.py "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
run contiguous-4k 110 --cache-lens 4096 --batches 1 4 16 32 64
run contiguous-long 110 --cache-lens 8192 16384 65536 --batches 16
run contiguous-8k1 40 --cache-lens 8192 --batches 1
run paged 110 --cache-lens 4096 8192 --batches 1 16 32 --page-size 256
for name in contiguous-4k contiguous-long contiguous-8k1 paged; do echo "## $name"; grep "^| [0-9]" "$OUT/$name.log" | cut -d'|' -f2-3,5-10; done
