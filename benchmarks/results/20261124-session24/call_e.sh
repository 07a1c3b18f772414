#!/usr/bin/env bash
# Call E: the Gluon decode kernel with its new keys first and rotated split streams (contiguous caches), as kept:
# the GPU tests of every file that reaches the decode path; then the kernel past the table's gates (+everywhere:
# two to four waves at batch 32-64, the 64k steps' long splits) against the Triton kernel and cuDNN.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 32 64 \
  --variants auto+everywhere --rounds 2 --append > "$OUT/ab-large.log" 2>&1
echo "ab large exit $?"
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 65536 --batches 4 8 16 \
  --variants auto+everywhere --rounds 2 --append > "$OUT/ab-64k.log" 2>&1
echo "ab 64k exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-large.log"; grep "^|" "$OUT/ab-64k.log"
