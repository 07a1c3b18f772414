#!/usr/bin/env bash
# Call M: two swapped consumer warpgroups taking the ring's blocks in turn (the second hands its max, sum and O^T to the
# first at the end), so that a block's math no longer waits for the one before's: test_kvcache's GPU tests (the
# Gluon tests on one and two consumers), then +c2 against one consumer with the append, contiguous and paged.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 16 \
  --variants auto auto+c2 --rounds 2 --append > "$OUT/ab-c2.log" 2>&1
echo "ab c2 exit $?"
timeout 120 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 65536 --batches 32 64 16 \
  --variants auto auto+c2 --rounds 2 --append > "$OUT/ab-large.log" 2>&1
echo "ab large exit $?"
timeout 80 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 --batches 4 16 --page-size 256 \
  --variants auto auto+c2 --rounds 2 --append > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep "^|" "$OUT/ab-c2.log"; grep "^|" "$OUT/ab-large.log"; grep "^|" "$OUT/ab-paged.log"
