#!/usr/bin/env bash
# GPU tests under compute-sanitizer: memcheck (any out-of-bounds or misaligned global access), racecheck
# (shared-memory hazards), synccheck or initcheck; anything it finds fails the run.
# Usage (repo root, on the GPU machine):
#     bash benchmarks/sanitizer.sh                                    # memcheck, the KV-cache and combine tests
#     TOOL=racecheck bash benchmarks/sanitizer.sh tests/test_forward_hopper.py -k "128"
# Arguments are pytest's and replace the default selection (the index-safety tests, the Triton backend on the
# KV-cache and combine tests' small shapes and one of each GPU grid). Kernels run 10-100x slower under
# the sanitizer: keep selections small. Logs go under $OUT (or ./gpu-out).
set -u -o pipefail
OUT=${OUT:-gpu-out}
TOOL=${TOOL:-memcheck}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
# PyTorch's caching allocator hides small overruns inside its pooled blocks: give every tensor its
# own cudaMalloc so that memcheck sees the true bounds.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)}
if [ -z "$SANITIZER" ]; then
  echo "compute-sanitizer not found (set SANITIZER=/path/to/compute-sanitizer)" >&2
  exit 2
fi
if [ $# -eq 0 ]; then
  export FLASHATTN_BACKEND=triton
  set -- tests/test_index_safety.py tests/test_kvcache.py tests/test_combine.py -k \
    "index_safety and not cuda_graph or triton and not bfloat16 and not float32 or paged_matches_contiguous_on_gpu or large_merge"
fi
timeout "${SANITIZER_TIMEOUT:-540}" "$SANITIZER" --tool "$TOOL" --error-exitcode 99 --print-limit 20 \
  --log-file "$OUT/$TOOL.log" \
  python3 -m pytest -q -p no:cacheprovider -x "$@" 2>&1 | tee "$OUT/sanitizer-pytest.log"
status=${PIPESTATUS[0]}
echo "exit status: $status (99 = $TOOL found errors, 0 = clean)"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|out of bounds|hazard" "$OUT/$TOOL.log" | head -20
exit "$status"
