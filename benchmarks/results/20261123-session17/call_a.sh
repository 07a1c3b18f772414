#!/usr/bin/env bash
# Call A: session 16's untried tests (the Gluon varlen forward on the three-consumer tile, the table's three-consumer
# kernel, the launch plans after the review mend), the atomic-dQ forms of the dK/dV tests on sm90 (TMA reductions),
# then the atomic-dQ sweep (benchmarks/sweeps/backward-atomic-dq.txt), one pass.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider -k "varlen or three_consumer or gluon_kernel_where" \
  tests/test_forward_hopper.py > "$OUT/tests-forward.log" 2>&1
echo "forward tests exit $?: $(tail -1 "$OUT/tests-forward.log")"
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_launch_plans.py tests/test_launcher.py \
  > "$OUT/tests-plans.log" 2>&1
echo "plan tests exit $?: $(tail -1 "$OUT/tests-plans.log")"
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider -k atomic tests/test_dkdv_loops.py \
  > "$OUT/tests-atomic.log" 2>&1
echo "atomic tests exit $?: $(tail -1 "$OUT/tests-atomic.log")"
grep -hE "^(FAILED|ERROR)" "$OUT"/tests-*.log | head -20
SWEEPS=benchmarks/sweeps/backward-atomic-dq.txt REPEAT=1 LIMIT=150 bash benchmarks/gpu_sweeps.sh 2>&1 | tail -60
