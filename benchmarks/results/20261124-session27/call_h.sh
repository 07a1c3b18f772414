#!/usr/bin/env bash
# Call H (H100): ring depth at the one-wave batch-16 steps (call F, one round: 3 stages 0.996x cuDNN, 4 stages 0.990x,
# 6 stages 0.984x), now that two consumers take only rings of an even stage count: 4 stages (the rule) against 2
# (two consumers) and 3 (one), five rounds.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
run() {  # name, limit, then decode_gluon_ab arguments
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 benchmarks/decode_gluon_ab.py --variants auto 64x2 64x3 --rounds 5 --append "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
run contiguous 200 --cache-lens 4096 16384 --batches 1 4 16 32
run paged 80 --cache-lens 8192 --batches 4 16 --page-size 256
for name in contiguous paged; do echo "## $name"; grep "^| [0-9]" "$OUT/$name.log" | cut -d'|' -f2-3,5-8,10-13; done
