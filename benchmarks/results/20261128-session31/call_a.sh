#!/usr/bin/env bash
# Call A: the half-width steps folded into the whole-block ones (38b6643: a HALF constexpr; no step's arithmetic
# changed) against the unfolded kernel of 08f8add (scratch/,
# git-ignored, carried), kernel-only; the per-sequence check on lengths under 64 and 192; then the forward and
# varlen GPU tests on the tree. (Session 30's call F, whose results were lost with that session.)
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
CASES="128 0 32 1;128 0 96 1" ROUNDS=1 CHECK_ONLY=1 PYTHONPATH=src timeout 60 \
  python3 benchmarks/varlen_fwd_ab.py new > "$OUT/varlen-check.log" 2>&1
echo "varlen check exit $?"; tail -8 "$OUT/varlen-check.log"
CASES="128 0 512 1;128 0 1024 1;128 0 512 0;128 1 512 1" ROUNDS=3 PYTHONPATH=src timeout 150 \
  python3 benchmarks/varlen_fwd_ab.py unfolded=scratch/forward_hopper_08f8add.py new > "$OUT/varlen-ab.log" 2>&1
echo "varlen ab exit $?"; tail -25 "$OUT/varlen-ab.log"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 270 tests/test_forward_hopper.py tests/test_varlen.py
