#!/usr/bin/env bash
# Call A: the key-slice dK/dV walking tiles on a persistent grid: its GPU tests (test_backward_hopper, with three
# programs forced so that each walks several tiles), then the sweep against one program a tile and the Triton
# entry (benchmarks/sweeps/dkdv-key-slices-persistent.txt).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests dkdv 170 tests/test_backward_hopper.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
SWEEPS=benchmarks/sweeps/dkdv-key-slices-persistent.txt REPEAT=1 LIMIT=60 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -E "^flashattn|^ +\*? +dkdv +[0-9]|^exit"
