#!/usr/bin/env bash
# Call J: the full grid again, now with the SM clock and board power the bench samples during each timing, to see
# the clock at the hdim-64 causal 16k backward in a full grid.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
timeout 320 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --out "$OUT/bench" \
  --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; grep -E "^d64 +causal=1 n=16384|^d64 +causal=1 n=8192" "$OUT/bench.log"
grep -B2 -A9 "hdim 64, causal" "$OUT/grid.md" | tail -8
