#!/usr/bin/env bash
# Call M: the host time of the short backward with and without the second stream (benchmarks/host_profile.py, hdim
# 128 causal 512), and the A/B of ops.CONCURRENT_GRADIENTS on the three causal 512-token backward cells.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
for flag in 1 0; do
  echo "== FLASHATTN_CONCURRENT_GRADIENTS=$flag"
  FLASHATTN_CONCURRENT_GRADIENTS=$flag timeout 100 python3 benchmarks/host_profile.py --calls 200 --top 5 2>&1 | grep -E "breakdown|per call|bench" | head -12
done | tee "$OUT/host.txt"
timeout 150 python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS --rounds 5 --cases \
  128:512:1 64:512:1 256:512:1 128:512:0 > "$OUT/ab.md" 2>&1
echo "ab exit $?"; cat "$OUT/ab.md"
