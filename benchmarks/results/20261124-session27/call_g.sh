#!/usr/bin/env bash
# Call G (H100): the 5-stage ring's launch failure (call F: early only): steps in a row eager, early and late; then
# compute-sanitizer memcheck and synccheck over one early step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
script=benchmarks/results/20261124-session27/ring5_check.py
for mode in late early; do
  timeout 60 python3 $script $mode 2000 > "$OUT/steps-$mode.log" 2>&1
  echo "steps $mode exit $?: $(grep -E 'ok|Error' "$OUT/steps-$mode.log" | head -2 | tr '\n' ' ')"
done
for tool in memcheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 $script early 2 > "$OUT/sanitizer-$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|ok' "$OUT/sanitizer-$tool.log" | tr '\n' ' ')"
  grep -m 12 -E "^=========  *(Invalid|Barrier|Race|at |by thread|Address)" "$OUT/sanitizer-$tool.log"
done
