#!/usr/bin/env bash
# Call B: launch plans (ops.LAUNCH_PLANS): their GPU tests, the launcher's, then the host breakdown with plans off and
# on (hdim 128 and 64 causal 512), and an A/B of the plans on the 512-token cells.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_launch_plans.py tests/test_launcher.py 2>&1 | tail -25 | tee "$OUT/tests.log"
for hd in 128 64; do
  timeout 120 python3 benchmarks/host_breakdown.py --head-dim $hd --causal --calls 300 > "$OUT/breakdown-$hd-causal.txt" 2>&1
  grep -E "^unwrapped|^block|^---|_triton|launch |replay|planned|FlashAttnFunction" "$OUT/breakdown-$hd-causal.txt" | head -60
done
timeout 150 python3 benchmarks/ab_flag.py --flag flashattn.ops:LAUNCH_PLANS --rounds 3 --cases 128:512:1 64:512:1 256:512:1 128:512:0 > "$OUT/ab-bwd.md" 2>&1
cat "$OUT/ab-bwd.md"
timeout 100 python3 benchmarks/ab_flag.py --flag flashattn.ops:LAUNCH_PLANS --mode fwd --rounds 3 --cases 128:512:1 64:512:1 256:512:1 > "$OUT/ab-fwd.md" 2>&1
cat "$OUT/ab-fwd.md"
