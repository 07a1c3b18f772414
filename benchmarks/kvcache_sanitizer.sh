#!/usr/bin/env bash
# Run the KV-cache and combine GPU tests under compute-sanitizer's memcheck: any out-of-bounds or
# misaligned global access by the append, decode or combine kernels fails the run.
# Usage (repo root, on the GPU machine): bash benchmarks/kvcache_sanitizer.sh [extra pytest args]
# Logs go under $OUT (or ./gpu-out). memcheck slows kernels ~10-100x: the selection below keeps the
# sanitized run to a few minutes; SANITIZER_TESTS overrides it.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 FLASHATTN_BACKEND=triton
# PyTorch's caching allocator hides small overruns inside its pooled blocks: give every tensor its
# own cudaMalloc so that memcheck sees the true bounds.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)}
if [ -z "$SANITIZER" ]; then
  echo "compute-sanitizer not found (set SANITIZER=/path/to/compute-sanitizer)" >&2
  exit 2
fi
TESTS=${SANITIZER_TESTS:-"tests/test_kvcache.py tests/test_combine.py"}
# -k: the triton backend on small shapes, the unchecked bad-index test, and one of each GPU grid
SELECT=${SANITIZER_SELECT:-"(triton or unchecked) and not bfloat16 and not float32 or paged_matches_contiguous_on_gpu or large_merge"}
timeout "${SANITIZER_TIMEOUT:-540}" "$SANITIZER" --tool memcheck --error-exitcode 99 --print-limit 20 \
  --log-file "$OUT/memcheck.log" \
  python3 -m pytest $TESTS -k "$SELECT" -q -p no:cacheprovider -x "$@" 2>&1 | tee "$OUT/sanitizer-pytest.log"
status=${PIPESTATUS[0]}
echo "exit status: $status (99 = memcheck found errors, 0 = clean)"
grep -E "ERROR SUMMARY|Invalid|out of bounds" "$OUT/memcheck.log" | head -20
exit "$status"
