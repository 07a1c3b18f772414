#!/usr/bin/env bash
# Call N (ac08386): the gradient-stream GPU tests after the FLOP rule; the backward GPU tests of test_varlen and
# test_sdpa; the host time of the 512-token causal backward (now serial by the rule) and A/B at 2k and 16k.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -n 8 -k "not float32 and not large" tests/test_api.py tests/test_varlen.py \
  tests/test_sdpa.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
timeout 60 python3 benchmarks/host_profile.py --calls 200 --top 3 2>&1 | grep -E "breakdown|direct eager" | tee "$OUT/host.txt"
timeout 100 python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS --rounds 3 --cases \
  64:2048:0 64:16384:1 128:1024:0 > "$OUT/ab.md" 2>&1
echo "ab exit $?"; cat "$OUT/ab.md"
