#!/usr/bin/env bash
# Call C: work units a program (abf82dd: unsplit swapped steps of more units than SMs stream ceil(units / SMs) units
# a program through one ring). The decode GPU tests (three units a program forced in the new forms), then the A/B:
# auto (the new rule) against +u1 (one unit a program, waves: main before) and cuDNN, contiguous and paged.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 170 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 32 64 --variants auto auto+u1 \
  --rounds 3 --append > "$OUT/ab.log" 2>&1
echo "ab exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 32 64 --variants auto auto+u1 \
  --rounds 3 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^| [0-9]" "$OUT/ab.log" "$OUT/ab-paged.log"
