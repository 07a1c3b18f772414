#!/usr/bin/env bash
# Call D (final kernel, 08f8add: half-width last blocks on two consumers only): the varlen bench twice (hdim 128,
# dense / packed equal / packed mixed, 512 / 1k / 16k, forward and backward).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src FLASHATTN_COMMIT=08f8add
mkdir -p "$OUT/bench"
for pass in 1 2; do
  timeout 170 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --head-dims 128 \
    --seqlens 512 1024 16384 --varlen --out "$OUT/bench" --markdown "$OUT/bench/varlen-pass$pass.md" > "$OUT/bench-$pass.log" 2>&1
  echo "bench pass $pass exit $?"; cat "$OUT/bench/varlen-pass$pass.md"
done
