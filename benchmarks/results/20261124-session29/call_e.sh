#!/usr/bin/env bash
# Call E: the debug kernel with each consumer's product issues per key-block call and the lengths it used; the
# tree kernel's runtime builds (one and two Q tiles, q_tiles_check.py) copied from Triton's cache for reading here.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT" scratch
S=benchmarks/results/20261124-session29
python3 $S/make_debug_kernel.py
for args in one ""; do
  timeout 150 python3 $S/q_tiles_debug.py $args > "$OUT/debug-${args:-two}.log" 2>&1
  echo "debug ${args:-two} exit $?"; grep -E "product issues|problems|wrong pairs" "$OUT/debug-${args:-two}.log" | head -12
done
for args in one two; do
  export TRITON_CACHE_DIR=/tmp/cache-$args
  rm -rf $TRITON_CACHE_DIR
  timeout 100 python3 $S/q_tiles_check.py $( [ $args = one ] && echo one ) 2>&1 | tail -1
  mkdir -p "$OUT/build-$args"
  for f in $(ls $TRITON_CACHE_DIR/*/attention_forward_hopper_kernel.{ptx,json,ttgir} 2>/dev/null); do
    cp "$f" "$OUT/build-$args/"
  done
  ls -la "$OUT/build-$args"
done
