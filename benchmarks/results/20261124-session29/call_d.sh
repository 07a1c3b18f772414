#!/usr/bin/env bash
# Call D: the debug kernel with output records (what each consumer computed before its store, against a float64
# reference and against what the output holds); one Q tile (control) and two.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT" scratch
S=benchmarks/results/20261124-session29
python3 $S/make_debug_kernel.py
for args in one ""; do
  timeout 150 python3 $S/q_tiles_debug.py $args > "$OUT/debug-${args:-two}.log" 2>&1
  echo "debug ${args:-two} exit $?"; head -34 "$OUT/debug-${args:-two}.log"; tail -3 "$OUT/debug-${args:-two}.log"
done
