#!/usr/bin/env bash
# Call M: the new forward tests: the Gluon varlen forward on the three-consumer tile (hdim 64, plain and causal, mixed
# and equal lengths), and the table's three-consumer kernel for causal hdim 64 at 4k.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider -k "varlen or three_consumer or gluon_kernel_where" \
  tests/test_forward_hopper.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
