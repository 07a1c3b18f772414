#!/usr/bin/env bash
# Call L: after the ping-pong fix (each consumer keeps the tile's key ranges under PINGPONG), test_forward_hopper's GPU
# tests in full.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 450 python3 -m pytest -q -m gpu -n 12 -p no:cacheprovider --durations=10 tests/test_forward_hopper.py \
  > "$OUT/tests-forward.log" 2>&1
echo "forward tests exit $?: $(grep -E 'passed|failed' "$OUT/tests-forward.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$OUT/tests-forward.log" | head -20
