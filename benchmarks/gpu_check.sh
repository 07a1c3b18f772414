#!/usr/bin/env bash
# One build-check-time cycle on the GPU machine: environment, benchmark, GPU test suite.
# Usage (from the repo root, on the device): bash benchmarks/gpu_check.sh [bench args...]
# Full logs go under $OUT (or ./gpu-out); a short summary is printed last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
BENCH_ARGS=${BENCH_ARGS:-"--head-dims 64 128 --seqlens 1024 4096 16384 --providers flashattn sdpa_flash sdpa_cudnn"}
TEST_ARGS=${TEST_ARGS:-"tests -n 8 --maxfail=40 -q"}
TEST_TIMEOUT=${TEST_TIMEOUT:-420}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "$BENCH_TIMEOUT" python3 -m flashattn.bench $BENCH_ARGS --out "$OUT" --markdown "$OUT/bench.md" \
    > "$OUT/bench.log" 2>&1
  echo "bench exit: $?" >> "$OUT/bench.log"
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "$TEST_TIMEOUT" python3 -m pytest $TEST_ARGS -p no:cacheprovider > "$OUT/tests.log" 2>&1
  echo "tests exit: $?" >> "$OUT/tests.log"
fi

echo "=== failures (first lines) ==="
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" 2>/dev/null | head -30
grep -E "^E  " "$OUT/tests.log" 2>/dev/null | sort | uniq -c | sort -rn | head -15
echo "=== tests ==="
tail -3 "$OUT/tests.log" 2>/dev/null
echo "=== bench ==="
cat "$OUT/bench.md" 2>/dev/null || tail -20 "$OUT/bench.log"
