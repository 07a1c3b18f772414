#!/usr/bin/env bash
# Call D (H200, c0978b2, the same lease as call C): the varlen bench twice more; call C's 512-token cells had moved
# by up to 40% between providers that share a kernel
export PYTHONPATH=src FLASHATTN_COMMIT=c0978b2; mkdir -p $OUT
for pass in 1 2; do
  timeout 200 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --head-dims 128 \
    --seqlens 512 1024 16384 --varlen --out "$OUT/bench$pass" --markdown "$OUT/bench$pass/varlen.md" \
    > "$OUT/bench$pass.log" 2>&1
  echo "pass $pass exit $?"; grep "^|" "$OUT/bench$pass/varlen.md"
done
