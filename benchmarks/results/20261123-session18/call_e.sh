#!/usr/bin/env bash
# Call E: the key-slice dK/dV in the table at hdim 64 and 128 from 2k: its GPU tests (seqlen_q = 1 no longer
# specialized), the backward grid at hdim 64 and 128 against SDPA, and the confirming sweep
# (benchmarks/sweeps/dkdv-key-slices-confirm.txt).
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
source benchmarks/gpu_tests.sh
run_tests dkdv 150 tests/test_backward_hopper.py
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
timeout 200 python3 -m flashattn bench --providers flashattn sdpa_flash sdpa_cudnn --head-dims 64 128 --modes bwd \
  --out "$OUT/bench" --markdown "$OUT/grid.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; grep -E "^d(64|128)" "$OUT/bench.log" | head -40
SWEEPS=benchmarks/sweeps/dkdv-key-slices-confirm.txt REPEAT=1 LIMIT=90 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -E "^flashattn|^ +\*? +dkdv +[0-9]"
