#!/usr/bin/env bash
# Call A: the GPU tests of every file that reaches the decode path (session 23's last three commits were never run
# on a GPU), then the Gluon decode kernel's new keys first (their block at the ring's head, the append stored before
# the key loop) against last, with the append, contiguous and paged, beside the Triton kernel and cuDNN.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 210 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 16 \
  --variants auto auto+last --rounds 3 --append > "$OUT/ab-append.log" 2>&1
echo "ab append exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 16384 --batches 1 4 16 --page-size 256 \
  --variants auto auto+last --rounds 2 --append > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-append.log"; grep "^|" "$OUT/ab-paged.log"
