#!/usr/bin/env bash
# Call E: dK/dV on a higher-priority second stream, dQ on the current one (ops.GRADIENT_STREAM_PRIORITY = -1), A/B
# against serial; then the same with equal priorities (0); then the large test_kernels cases (4 workers).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
CASES="64:2048:0 64:4096:0 64:16384:1 64:8192:1 128:2048:0 128:16384:0 256:4096:1"
timeout 150 python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS --rounds 5 --cases $CASES > "$OUT/ab-priority.md" 2>&1
echo "ab (priority -1) exit $?"; cat "$OUT/ab-priority.md"
FLASHATTN_GRADIENT_STREAM_PRIORITY=0 timeout 150 python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS --rounds 5 --cases $CASES > "$OUT/ab-equal.md" 2>&1
echo "ab (equal priority) exit $?"; cat "$OUT/ab-equal.md"
timeout 270 python3 -m pytest -q -m gpu tests/test_kernels.py -n 4 -k "large and not float32" > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
