#!/usr/bin/env bash
# Call B: the early first block as a launch option (EARLY_FIRST_BLOCK; by rule in unsplit launches only): decode GPU
# tests (the Gluon kernel's problems with the rule and with the early read everywhere), then A/B of the rule ("auto")
# against early everywhere (+early) and late everywhere (+late, the structure before call A), five rounds.
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
  timeout "$limit" python3 benchmarks/decode_gluon_ab.py --variants auto auto+early auto+late --rounds 5 --append \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
run contiguous-4k 130 --cache-lens 4096 --batches 1 2 4 8 16 32
run contiguous-8k 70 --cache-lens 8192 16384 --batches 1 4
run paged 130 --cache-lens 4096 8192 --batches 1 4 16 32 --page-size 256
for name in contiguous-4k contiguous-8k paged; do echo "## $name"; grep "^| [0-9]" "$OUT/$name.log" | cut -d'|' -f2-3,5-11; done
