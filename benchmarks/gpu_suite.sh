#!/usr/bin/env bash
# The whole test suite on the GPU machine, in parts that each fit one device call (10 minutes, with the
# kernels compiled from scratch on a fresh machine). Run parts 1-5 in turn:
#     SHARD=1 bash benchmarks/gpu_suite.sh
# Each part is a fifth of every test file (tests/conftest.py: FLASHATTN_TEST_SHARD, split by a hash of
# the test id), so the slow kernel files spread evenly. test_transformers needs transformers: carry
# .wheels (see README, "GPU machine") and each part installs them to /tmp/hf. The Nsight Compute tests
# profile the GPU and run alone, after part 5's parallel run.
# Logs go to $OUT/suite-<part>.log; the failures and the pytest summary are printed last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
PARTS=5
mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
case "${SHARD:?set SHARD=1..5}" in
  [1-5]) ;;
  *) echo "SHARD must be 1 to $PARTS" >&2; exit 2 ;;
esac
if ls .wheels/*.whl > /dev/null 2>&1; then
  pip install -q --no-index --no-deps --target /tmp/hf $(ls .wheels/*.whl | grep -v numpy) > /dev/null 2>&1
  export PYTHONPATH=$PYTHONPATH:/tmp/hf
fi
LOG="$OUT/suite-$SHARD.log"
FLASHATTN_TEST_SHARD="$SHARD/$PARTS" timeout -s INT "${SUITE_TIMEOUT:-530}" \
  python3 -m pytest tests -n "${WORKERS:-14}" -q -p no:cacheprovider -k "not test_gpu_ncu" --durations=15 > "$LOG" 2>&1
echo "pytest exit $?" >> "$LOG"
if [ "$SHARD" = "$PARTS" ]; then
  timeout 120 python3 -m pytest tests/test_iomeasure.py -k test_gpu_ncu -q -p no:cacheprovider >> "$LOG" 2>&1
  echo "ncu tests exit $?" >> "$LOG"
fi
grep -E "^(FAILED|ERROR)" "$LOG" | head -30
grep -E "passed|failed|exit" "$LOG" | tail -4
