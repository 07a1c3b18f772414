#!/usr/bin/env bash
# Call M: the final code's GPU tests on the files this session touched, and ncu_decode.py after its refactor.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 330 python3 -m pytest -q -m gpu tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py \
  tests/test_dq_hopper.py tests/test_forward_hopper.py tests/test_api.py -n 14 > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
timeout 120 python3 benchmarks/ncu_decode.py --case ours-b1:provider=flashattn,batch=1,cache=8192 > "$OUT/ncu.log" 2>&1
echo "ncu exit $?"; head -8 "$OUT/ncu.log" | cut -c1-200
