#!/usr/bin/env bash
# Call B: where the paged steps' 0.5-1.5% goes: 256-key pages scattered at random over the pool (the bench's
# layout) against the same pages one after the other (--pages-in-order), and 4096-key pages in order (at 4k keys the
# contiguous cache's layout); contiguous for reference. Five alternating rounds against cuDNN (contiguous) each.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
run() {  # name, then decode_gluon_ab arguments
  local name=$1
  shift
  timeout 100 python3 benchmarks/decode_gluon_ab.py --variants auto --rounds 5 --append "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
run contiguous --cache-lens 4096 8192 --batches 4 16 32
run paged256 --cache-lens 4096 8192 --batches 4 16 32 --page-size 256
run paged256-in-order --cache-lens 4096 8192 --batches 4 16 32 --page-size 256 --pages-in-order
run paged4096-in-order --cache-lens 4096 --batches 4 16 32 --page-size 4096 --pages-in-order
for name in contiguous paged256 paged256-in-order paged4096-in-order; do echo "## $name"; grep "^| [0-9]" "$OUT/$name.log"; done
