#!/usr/bin/env bash
# Call F: the varlen GPU tests (call D ran out of time on a cold lease), then the varlen bench (issue 3: within 10%
# of dense) with launch plans for packed calls: dense, equal lengths packed, mixed lengths; hdim 64/128/256.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 230 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_varlen.py > "$OUT/tests-varlen.log" 2>&1
echo "varlen tests exit $?: $(tail -1 "$OUT/tests-varlen.log")"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
timeout 340 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --varlen \
  --head-dims 64 128 256 --seqlens 512 1024 2048 4096 8192 16384 --out "$OUT/bench" --markdown "$OUT/varlen.md" \
  > "$OUT/bench.log" 2>&1
echo "bench exit $?"
cat "$OUT/varlen.md" 2>/dev/null | head -80
