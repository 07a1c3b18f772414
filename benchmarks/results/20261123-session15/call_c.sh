#!/usr/bin/env bash
# Call C: the concurrent dQ / dK/dV launch and the 512-token causal hdim-128 tile: GPU tests of the backward and
# forward paths, then the A/B of ops.CONCURRENT_GRADIENTS (backward, alternating in rounds).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 280 python3 -m pytest -q -m gpu tests/test_api.py tests/test_kernels.py -n 14 -k "not float32" > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
timeout 280 python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS --rounds 3 --cases \
  64:2048:0 64:16384:1 64:4096:0 64:1024:1 128:2048:0 128:4096:1 128:512:1 256:2048:0 256:16384:1 > "$OUT/ab.md" 2>&1
echo "ab exit $?"; cat "$OUT/ab.md"
