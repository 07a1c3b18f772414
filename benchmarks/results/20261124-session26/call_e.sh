#!/usr/bin/env bash
# Call E: programs of several units on one consumer (two faulted or gave wrong rows in calls C-D). compute-sanitizer's
# memcheck over call D's faulting step (two consumers, two units a program: units_debug.py 2 2); the decode GPU tests;
# the A/B: auto (units, one consumer), +u1 (two consumers, one unit a program: main before), +c1+u1.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
timeout 150 compute-sanitizer --tool memcheck --print-limit 8 python3 benchmarks/results/20261124-session26/units_debug.py \
  2 2 > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -v "Warning\|warn(" "$OUT/memcheck.log" | grep -m 40 -E "=====|units wrong|Error" | cut -c1-220
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 32 64 \
  --variants auto auto+u1 auto+c1+u1 --rounds 3 --append > "$OUT/ab.log" 2>&1
echo "ab exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 32 64 --variants auto auto+u1 \
  auto+c1+u1 --rounds 3 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^| [0-9]" "$OUT/ab.log" "$OUT/ab-paged.log"
