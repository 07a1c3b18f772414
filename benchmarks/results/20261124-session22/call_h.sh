#!/usr/bin/env bash
# Call H: (1) causal hdim 64 1k forward candidates (sweep, twice); (2) the hdim-64 backward cells near 1.3x sdpa_flash
# (2k, causal 16k), twice; (3) the packed forward and backward against the dense call at hdim 128 (issue 3's prefill
# target), with packed calls on one Q tile and dense ones on two.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
SWEEPS=benchmarks/sweeps/forward-causal-64-1k.txt REPEAT=2 LIMIT=100 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      forward" | tail -20
for pass in 1 2; do
  timeout 100 python3 -m flashattn bench --providers flashattn sdpa_flash --head-dims 64 --seqlens 2048 16384 \
    --modes bwd --out "$OUT/bench-bwd$pass" --markdown "$OUT/bwd$pass.md" > "$OUT/bench-bwd$pass.log" 2>&1
  echo "bwd pass $pass exit $?"; grep -A4 "^| seqlen" "$OUT/bwd$pass.md"
done
timeout 200 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --head-dims 128 \
  --varlen --out "$OUT/bench-varlen" --markdown "$OUT/varlen.md" > "$OUT/bench-varlen.log" 2>&1
echo "varlen exit $?"; cat "$OUT/varlen.md"
