#!/usr/bin/env bash
# Call B: (1) the two-Q-tile fault through the debug kernel (make_debug_kernel.py, q_tiles_debug.py): what each
# consumer saw against what the loader copied; control with one Q tile. (2) Mixed-length packed calls against dense
# calls on their own lengths (varlen_fwd_ab.py's new baseline), the table's tile and the persistent 2-stage one.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
S=benchmarks/results/20261124-session29
mkdir -p scratch; python3 $S/make_debug_kernel.py
for args in one ""; do
  timeout 120 python3 $S/q_tiles_debug.py $args > "$OUT/debug-${args:-two}.log" 2>&1
  echo "debug ${args:-two} exit $?"; head -40 "$OUT/debug-${args:-two}.log"; tail -3 "$OUT/debug-${args:-two}.log"
done
CASES="128 1 16384 1;128 0 16384 1;128 1 8192 1" ROUNDS=3 timeout 200 \
  python3 benchmarks/varlen_fwd_ab.py new new+p2 > "$OUT/ab.log" 2>&1
echo "ab exit $?"
cat "$OUT/ab.log"
