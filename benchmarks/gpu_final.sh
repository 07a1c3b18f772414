#!/usr/bin/env bash
# One closing GPU cycle: re-run the GPU tests that failed last time, then the benchmarks (attention on
# the ANCHORS head dims with the packed providers, a decode step) and the memory/io measurements.
# Everything is written under $OUT and packed into $OUT/results.tgz; short tables are printed last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/r"
export PYTHONPATH=src PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# the device copy of the tree may carry stale git metadata: pass FLASHATTN_COMMIT=<hash> to tag the results
R="$OUT/r"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest ${TEST_ARGS:-} -n 12 -q -p no:cacheprovider > "$R/tests.log" 2>&1
echo "tests exit $?" >> "$R/tests.log"
timeout "${BENCH_TIMEOUT:-210}" python3 -m flashattn bench --head-dims 64 128 256 --seqlens 1024 4096 16384 \
  --providers flashattn sdpa_flash sdpa_cudnn --varlen --out "$R" --markdown "$R/bench.md" --plot "$R/bench.png" \
  > "$R/bench.log" 2>&1
echo "bench exit $?" >> "$R/bench.log"
timeout "${DECODE_TIMEOUT:-100}" python3 -m flashattn bench --mode decode --cache-lens 8192 65536 --out "$R" \
  --markdown "$R/decode.md" > "$R/decode.log" 2>&1
echo "decode exit $?" >> "$R/decode.log"
timeout 60 python3 -m flashattn memory --model llama-3-8b --seqlens 2048 8192 --measure > "$R/memory.log" 2>&1
timeout 180 python3 -m flashattn io --measure --seqlen 4096 --batch 4 --heads 16 --head-dim 128 > "$R/io.log" 2>&1
tar czf "$OUT/results.tgz" -C "$R" .
grep -E "^(FAILED|ERROR)" "$R/tests.log" | head -10; tail -2 "$R/tests.log"
tail -2 "$R/bench.log"; tail -1 "$R/decode.log"
