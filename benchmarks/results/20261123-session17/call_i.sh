#!/usr/bin/env bash
# Call I: call H's three failures in test_dkdv_loops / test_dkdv_split / test_mask_skip, named (-rf) this time.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 230 python3 -m pytest -q -rf -m gpu -n 12 -p no:cacheprovider tests/test_dkdv_loops.py tests/test_dkdv_split.py \
  tests/test_mask_skip.py > "$OUT/tests-loops.log" 2>&1
echo "exit $?: $(tail -1 "$OUT/tests-loops.log")"
grep -E "^FAILED|Error|assert" "$OUT/tests-loops.log" | head -30
