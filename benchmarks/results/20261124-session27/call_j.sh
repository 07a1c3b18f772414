#!/usr/bin/env bash
# Call J (H200): packed (varlen) calls against dense ones on the current code, hdim 128, at 512, 1k and 16k tokens a
# sequence (session 22's grid read mixed lengths 0.82 / 0.90 at 512 / 1k non-causal and 0.85 at 16k causal).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
timeout 420 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --head-dims 128 \
  --seqlens 512 1024 16384 --varlen --out "$OUT/bench" --markdown "$OUT/bench/varlen.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
grep "^|" "$OUT/bench/varlen.md"
