#!/usr/bin/env bash
# Session 11: part PART of 3 of the suite's files that the Gluon forward's own files do not cover.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
if [ -n "${PROFILE:-}" ]; then
  timeout -k 5 60 python3 scratch/host_cprofile.py > "$OUT/host_cprofile.log" 2>&1
fi
pip install -q --no-index --no-deps --target /tmp/hf $(ls .wheels/*.whl | grep -v numpy) > /dev/null 2>&1
export PYTHONPATH=$PYTHONPATH:/tmp/hf
FILES=$(ls tests/test_*.py | grep -v -E "test_(kernels|varlen|sdpa|forward_hopper)\.py$")
LOG="$OUT/rest-$PART.log"
FLASHATTN_TEST_SHARD="$PART/3" timeout -k 30 -s INT "${SUITE_TIMEOUT:-480}" \
  python3 -m pytest $FILES -n 14 -q -p no:cacheprovider -k "not test_gpu_ncu" --durations=10 > "$LOG" 2>&1
echo "pytest exit $?" >> "$LOG"
if [ "$PART" = 3 ]; then
  timeout 120 python3 -m pytest tests/test_iomeasure.py -k test_gpu_ncu -q -p no:cacheprovider >> "$LOG" 2>&1
  echo "ncu tests exit $?" >> "$LOG"
fi
grep -E "^(FAILED|ERROR)" "$LOG" | head -30
grep -E "passed|failed|exit" "$LOG" | tail -4
[ -n "${PROFILE:-}" ] && head -60 "$OUT/host_cprofile.log"
true
