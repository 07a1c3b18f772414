#!/usr/bin/env bash
# Call F: call E's fault (two swapped consumers on 5 or 6 ring stages, unsplit 4k batch 16; call B's on 3): which
# stage counts and consumer counts fault, each step in its own process, then compute-sanitizer memcheck on the first
# that does.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
script=benchmarks/results/20261124-session25/stage_fault.py
first=""
for cfg in "4096 16 4 2" "4096 16 6 2" "4096 16 5 2" "4096 16 3 2" "4096 16 6 1" "4096 16 5 1" "4096 4 6 2" \
           "8192 16 6 2" "1024 16 6 2"; do
  timeout 60 python3 $script $cfg > "$OUT/run.log" 2>&1
  rc=$?
  echo "[$cfg] exit $rc: $(grep -E 'max diff|Error' "$OUT/run.log" | head -1)"
  [ $rc -ne 0 ] && [ -z "$first" ] && first="$cfg"
done
if [ -n "$first" ]; then
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 "$SANITIZER" --tool memcheck --print-limit 5 \
    --log-file "$OUT/memcheck.log" python3 $script $first > "$OUT/memcheck-run.log" 2>&1
  echo "memcheck [$first] exit $?"
  grep -v "^=========     " "$OUT/memcheck.log" | head -40
fi
