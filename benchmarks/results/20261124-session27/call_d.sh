#!/usr/bin/env bash
# Call D (H100): the rule (the partitions read the length, split 0's first block early, in launches of up to 5
# splits) on an H100, whose split counts differ: decode GPU tests; A/B of the rule against the length read before the
# partitions everywhere (+late, the kernel's structure before this session), five rounds.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
run() {  # name, limit, then decode_gluon_ab arguments
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 benchmarks/decode_gluon_ab.py --variants auto auto+late --rounds 5 --append "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
run contiguous 150 --cache-lens 4096 16384 --batches 1 2 3 4 8 16 32
run paged 80 --cache-lens 4096 8192 --batches 4 16 32 --page-size 256
for name in contiguous paged; do echo "## $name"; grep "^| [0-9]" "$OUT/$name.log" | cut -d'|' -f2-3,5-7,9-11; done
