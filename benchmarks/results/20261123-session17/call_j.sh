#!/usr/bin/env bash
# Call J: the shortest causal hdim-128 forward tile capped at 168 registers (its packed build took 186): the packed
# and dense calls timed back to back (host_serving.py), the bench's varlen cells at 512 and 1k, and test_varlen.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=cf9f261
mkdir -p "$OUT"
timeout 60 python3 benchmarks/host_serving.py --calls 300 2>&1 | grep -E "^\| (bench|call)|^\|---" | tee "$OUT/host_serving.log"
timeout 150 python3 -m flashattn bench --providers flashattn flashattn_varlen --varlen --head-dims 128 \
  --seqlens 512 1024 --out "$OUT/bench" --markdown "$OUT/varlen.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; grep -E "^d128" "$OUT/bench.log"
timeout 230 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_varlen.py > "$OUT/tests-varlen.log" 2>&1
echo "varlen tests exit $?: $(tail -1 "$OUT/tests-varlen.log")"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
