#!/usr/bin/env bash
# Call A: the forward's loader skips packed calls' empty tiles. GPU tests of the forward and varlen files; A/B on the
# bench's packed shapes: the kernel before (d83fd7c, carried in scratch/), the tree's, the tree's with two Q tiles
# for packed calls (+qb2: the session-22 fault); memcheck over a small three-consumer +qb2 check.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 170 tests/test_varlen.py tests/test_forward_hopper.py
export PYTHONPATH=src
CASES="128 0 512 1;128 1 512 1;128 0 1024 1;128 1 1024 1;128 0 16384 1;128 1 16384 1;128 0 512 0;64 0 512 1" \
  ROUNDS=3 timeout 260 python3 benchmarks/varlen_fwd_ab.py base=scratch/forward_hopper_d83fd7c.py new new+qb2 \
  > "$OUT/ab.log" 2>&1
echo "ab exit $?"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 CASES="64 0 512 1;128 0 512 1" TOKENS=2048 CHECK_ONLY=1 timeout 120 \
  "$SANITIZER" --tool memcheck --print-limit 10 --log-file "$OUT/memcheck.log" \
  python3 benchmarks/varlen_fwd_ab.py new new+qb2 > "$OUT/memcheck-run.log" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY" "$OUT/memcheck.log"; grep -E -A6 "^========= Invalid" "$OUT/memcheck.log" | head -24
cat "$OUT/memcheck-run.log" | tail -8
cat "$OUT/ab.log"
