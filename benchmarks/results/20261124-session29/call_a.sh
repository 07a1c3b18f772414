#!/usr/bin/env bash
# Call A: (1) the two-Q-tile fault on a small dense call: control (one Q tile), two Q tiles, two with the masked
# call's Q release moved after its last P V (scratch/forward_hopper_late_release.py), each in its own process; then
# compute-sanitizer racecheck and synccheck over the two-Q case. (2) Causal mixed 16k: packed calls on a persistent
# grid (2 or 3 stages; two Q tiles on 2) against the table's one program a tile.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
S=benchmarks/results/20261124-session29
for args in one "" scratch/forward_hopper_late_release.py; do
  timeout 60 python3 $S/q_tiles_check.py $args 2>&1 | tail -2
done
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 "$SANITIZER" --tool $tool --print-limit 20 \
    --log-file "$OUT/$tool.log" python3 $S/q_tiles_check.py > "$OUT/$tool-run.log" 2>&1
  echo "$tool exit $?: $(tail -1 "$OUT/$tool-run.log")"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$OUT/$tool.log" | head -5
  grep -E -A8 "^========= (Error|Warning|Race)" "$OUT/$tool.log" | head -30
done
CASES="128 1 16384 1;128 0 16384 1;128 1 8192 1;128 1 1024 1" ROUNDS=3 timeout 240 \
  python3 benchmarks/varlen_fwd_ab.py new new+p3 new+p2 new+p2+qb2 > "$OUT/ab.log" 2>&1
echo "ab exit $?"
cat "$OUT/ab.log"
