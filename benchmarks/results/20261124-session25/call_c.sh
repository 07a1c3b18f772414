#!/usr/bin/env bash
# Call C: two Gluon decode programs an SM, as registers Gluon's warp specialization can hand out (call B's 80 + 128
# faulted: the first consumer was told to lower 80 registers to 88): two consumers at 80 (first) and 136 (second)
# under an 80-register launch, or one consumer under a 128-register launch. Each variant first alone on one case
# (a fault kills its process only), then the A/B of those that ran, with the append.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
ok=()
for v in auto+pair auto+pair+c1; do
  timeout 60 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 --batches 32 --variants "$v" --rounds 1 \
    --append > "$OUT/smoke-$v.log" 2>&1
  rc=$?
  echo "smoke $v exit $rc: $(grep '^| 4096' "$OUT/smoke-$v.log")"
  [ $rc -eq 0 ] && ! grep -q WRONG "$OUT/smoke-$v.log" && ok+=("$v")
done
[ ${#ok[@]} -eq 0 ] && exit 0
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 65536 --batches 16 32 64 \
  --variants auto "${ok[@]}" --rounds 3 --append > "$OUT/ab-pair.log" 2>&1
echo "ab pair exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 16384 --batches 1 4 8 \
  --variants auto "${ok[@]}" --rounds 3 --append > "$OUT/ab-pair-split.log" 2>&1
echo "ab pair split exit $?"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 4 16 32 --page-size 256 \
  --variants auto "${ok[@]}" --rounds 3 --append > "$OUT/ab-pair-paged.log" 2>&1
echo "ab pair paged exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep -h "^|" "$OUT"/ab-pair.log "$OUT"/ab-pair-split.log "$OUT"/ab-pair-paged.log
