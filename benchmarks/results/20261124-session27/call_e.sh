#!/usr/bin/env bash
# Call E (H100): the one-wave batch-16 steps (0.985-0.99x cuDNN on an H100, level on an H200): ring depth, 4 stages
# (the rule) against 5 and 6, five rounds.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
run() {  # name, limit, then decode_gluon_ab arguments
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 benchmarks/decode_gluon_ab.py --variants auto 64x5 64x6 --rounds 5 --append "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
run contiguous 120 --cache-lens 4096 16384 --batches 16 32
run paged 60 --cache-lens 8192 --batches 16 --page-size 256
for name in contiguous paged; do echo "## $name"; grep "^| [0-9]" "$OUT/$name.log" | cut -d'|' -f2-3,5-8,10-13; done
