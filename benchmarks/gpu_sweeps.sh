#!/usr/bin/env bash
# Tile sweeps in one device call: every line of a sweep file is the argument list of one `flashattn blocks`
# run (each candidate is checked against SDPA before it is timed). Run from the repo root on the GPU machine:
#     SWEEPS=benchmarks/sweeps/backward-causal.txt REPEAT=2 bash benchmarks/gpu_sweeps.sh
# REPEAT runs the whole file that many times (run-to-run spread on one lease). Logs (one per line and
# pass) go to $OUT/sweeps.tgz, one file, as the device tool brings back only a few files per call; the
# timed rows are printed last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
LOGS="$OUT/sweeps"
mkdir -p "$LOGS"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$LOGS/env.txt" 2>&1
number=0
for pass in $(seq "${REPEAT:-1}"); do
  while read -r line; do
    case "$line" in ''|'#'*) continue ;; esac
    number=$((number + 1))
    log="$LOGS/$(printf %02d "$number")-pass$pass.log"
    echo "flashattn blocks $line" > "$log"
    # shellcheck disable=SC2086  # the line is an argument list
    timeout "${LIMIT:-240}" python3 -m flashattn blocks $line >> "$log" 2>&1
    echo "exit $?" >> "$log"
  done < "${SWEEPS:?set SWEEPS to a sweep file}"
done
echo "=== summary"
for log in "$LOGS"/*.log; do
  head -1 "$log"
  grep -E "^\*? +(forward|dkdv|dq) " "$log" | awk '{print "   ", $0}'
  grep -E "^exit [^0]" "$log"
done
tar czf "$OUT/sweeps.tgz" -C "$OUT" sweeps && rm -rf "$LOGS"
