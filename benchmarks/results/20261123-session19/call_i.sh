#!/usr/bin/env bash
# Call I: the key-slice dK/dV with one barrier freeing a stage (3 -> 2 bar.sync a loop) against session 18's kernel,
# kernel-only and as the whole backward (dkdv_barrier_ab.py); the key-slice GPU tests.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 240 python3 benchmarks/results/20261123-session19/dkdv_barrier_ab.py > "$OUT/barrier-ab.log" 2>&1
echo "ab exit $?"; cat "$OUT/barrier-ab.log" | tail -12
source benchmarks/gpu_tests.sh
run_tests dkdv 150 tests/test_backward_hopper.py -k "slices or 128_keys"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -10
