#!/usr/bin/env bash
# Call D: where a decode step's time goes: global-timer stamps per program of the Gluon kernel
# (benchmarks/decode_timeline.py, a probe), contiguous and paged, steps back to back in a CUDA graph.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 150 python3 benchmarks/decode_timeline.py --cases 4096x16 4096x32 4096x64 8192x16 65536x16 8192x1 8192x4 \
  4096x4 > "$OUT/timeline.log" 2>&1
echo "timeline exit $?"
timeout 100 python3 benchmarks/decode_timeline.py --page-size 256 --cases 4096x16 4096x32 8192x4 4096x4 8192x16 \
  > "$OUT/timeline-paged.log" 2>&1
echo "timeline paged exit $?"
grep -E "Error|Traceback" -A5 "$OUT"/timeline*.log | head -30
cat "$OUT/timeline.log" "$OUT/timeline-paged.log" | grep "^|"
