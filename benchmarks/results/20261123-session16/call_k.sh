#!/usr/bin/env bash
# Call K: the final code (after the review): test_forward_hopper's GPU tests in full (calls E, F and G stopped at their
# time limits), then test_launch_plans and test_launcher.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 400 python3 -m pytest -q -m gpu -n 12 -p no:cacheprovider --durations=10 tests/test_forward_hopper.py \
  > "$OUT/tests-forward.log" 2>&1
echo "forward tests exit $?: $(grep -E 'passed|failed' "$OUT/tests-forward.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$OUT/tests-forward.log" | head -20
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_launch_plans.py tests/test_launcher.py \
  > "$OUT/tests-plans.log" 2>&1
echo "plan tests exit $?: $(tail -1 "$OUT/tests-plans.log")"
