#!/usr/bin/env bash
# Call D: call C's 13 out-of-memory failures (test_kernels' large cases, 14 workers on one GPU) again with 3 workers;
# the A/B of ops.CONCURRENT_GRADIENTS on the long causal cases (call C: 0.983 at hdim 64 causal 16k), 5 rounds.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 240 python3 -m pytest -q -m gpu tests/test_kernels.py -n 3 -k "large and not float32" > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
timeout 330 python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS --rounds 5 --cases \
  64:16384:1 64:8192:1 64:16384:0 128:16384:1 64:2048:0 > "$OUT/ab.md" 2>&1
echo "ab exit $?"; cat "$OUT/ab.md"
