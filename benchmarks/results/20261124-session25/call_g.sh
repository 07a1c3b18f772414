#!/usr/bin/env bash
# Call G: call F's single eager steps never faulted; call E's did inside the A/B's CUDA graphs. The same steps, then
# 200 replays of a graph of 8 of them, each configuration in its own process; memcheck on the first that faults.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
script=benchmarks/results/20261124-session25/stage_fault.py
first=""
for cfg in "4096 16 4 2" "4096 16 6 2" "4096 16 5 2" "4096 16 6 1" "4096 32 4 2" "4096 4 4 2" "4096 4 6 2"; do
  timeout 60 python3 $script $cfg 200 > "$OUT/run.log" 2>&1
  rc=$?
  echo "[$cfg] exit $rc: $(grep -E 'max diff|replays|Error' "$OUT/run.log" | tr '\n' ' ' | head -c 300)"
  [ $rc -ne 0 ] && [ -z "$first" ] && first="$cfg"
done
if [ -n "$first" ]; then
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 "$SANITIZER" --tool memcheck --print-limit 5 \
    --log-file "$OUT/memcheck.log" python3 $script $first 20 > "$OUT/memcheck-run.log" 2>&1
  echo "memcheck [$first] exit $?"
  grep -v "^=========     " "$OUT/memcheck.log" | head -40
  tail -3 "$OUT/memcheck-run.log"
fi
