#!/usr/bin/env bash
# Call G: the full ANCHORS grid with launch plans and the three-consumer causal hdim-64 forward from 4k, then
# test_forward_hopper's GPU tests alone (call F ran out of time at about 90% of its files, no failure).
set -u
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True FLASHATTN_COMMIT=5430def
mkdir -p $OUT/bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 330 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out $OUT/bench \
  --markdown $OUT/bench/grid.md --plot $OUT/bench/bench.png > $OUT/bench/bench.log 2>&1
echo "bench exit $?"
cat $OUT/bench/grid.md
timeout 230 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_forward_hopper.py > "$OUT/tests.log" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
