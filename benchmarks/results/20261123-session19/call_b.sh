#!/usr/bin/env bash
# Call B: why call A's key-slice dK/dV ran 9-13% slower than session 18's even on one tile a program: the dK/dV
# kernel alone (dkdv_ab.py) for session 18's kernel, this tree's with one and two K/V buffers, and persistent;
# then the key-slice GPU tests (one K/V buffer off the persistent grid: call A's 4-stage hdim-128 tile did not fit).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
timeout 200 python3 benchmarks/results/20261123-session19/dkdv_ab.py > "$OUT/ab.log" 2>&1; echo "ab exit $?"
cat "$OUT/ab.log" | tail -12
source benchmarks/gpu_tests.sh
run_tests dkdv 170 tests/test_backward_hopper.py -k "slices or persistent"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
