#!/usr/bin/env bash
# Call E: the Gluon forward's per-consumer key blocks: the forward GPU tests (test_forward_hopper), then the causal
# hdim-64 sweep (benchmarks/sweeps/forward-causal-64-consumers.txt, twice).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_forward_hopper.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
SWEEPS=benchmarks/sweeps/forward-causal-64-consumers.txt REPEAT=2 LIMIT=150 timeout 350 bash benchmarks/gpu_sweeps.sh
