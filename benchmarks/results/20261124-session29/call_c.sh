#!/usr/bin/env bash
# Call C: call B's debug part again (scratch/ made first); equal-length packed calls on the table's long tile
# against the persistent 2-stage one (what a rule "packed calls take the persistent grid" would cost them).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT" scratch
S=benchmarks/results/20261124-session29
python3 $S/make_debug_kernel.py
for args in one ""; do
  timeout 120 python3 $S/q_tiles_debug.py $args > "$OUT/debug-${args:-two}.log" 2>&1
  echo "debug ${args:-two} exit $?"; head -40 "$OUT/debug-${args:-two}.log"; tail -3 "$OUT/debug-${args:-two}.log"
done
CASES="128 1 16384 0;128 0 16384 0;128 1 8192 0;128 0 8192 0" ROUNDS=3 timeout 200 \
  python3 benchmarks/varlen_fwd_ab.py new new+p2 > "$OUT/ab.log" 2>&1
echo "ab exit $?"
cat "$OUT/ab.log"
