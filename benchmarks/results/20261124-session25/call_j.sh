#!/usr/bin/env bash
# Call J: call D found a split step's merge launch costing 2.25 us. The Gluon kernel now releases the chained merge at
# its start (griddepcontrol.launch_dependents only; the kernel itself is not chained): the merge's programs wait on
# the idle SMs instead of being launched after the attention. Against "+late" (as before), split steps, with the
# append, contiguous and paged; test_kvcache's GPU tests first.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests kvcache 150 tests/test_kvcache.py
export PYTHONPATH=src
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 2 4 8 \
  --variants auto auto+late --rounds 3 --append > "$OUT/ab-release.log" 2>&1
echo "ab exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 1 4 8 --page-size 256 \
  --variants auto auto+late --rounds 3 --append > "$OUT/ab-release-paged.log" 2>&1
echo "ab paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep -h "^|" "$OUT/ab-release.log" "$OUT/ab-release-paged.log"
