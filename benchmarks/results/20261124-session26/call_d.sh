#!/usr/bin/env bash
# Call D: call C with each unit's blocks alternating from its own first (call C's two-consumer units gave wrong rows);
# units_debug.py first: which outputs go wrong, by program and unit. Then the decode GPU tests and the A/B:
# auto (the new rule) against +u1 (one unit a program, waves: main before) and cuDNN, contiguous and paged.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
timeout 120 python3 benchmarks/results/20261124-session26/units_debug.py > "$OUT/debug.log" 2>&1
echo "debug exit $?"
cut -c1-400 "$OUT/debug.log" | grep -v Warning
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
