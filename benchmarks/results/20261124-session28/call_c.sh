#!/usr/bin/env bash
# Call C (H200): one Q tile where keys fill no block (ops._forward_q_buffers). The new GPU test under the old rule (it must
# fail); the forward's and varlen's GPU tests; the varlen bench (issue 3's prefill target) on the final kernel.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src:tests
timeout 90 python3 -c "
import sys, pytest
import flashattn.ops as ops
rule = ops._forward_q_buffers
ops._forward_q_buffers = lambda config, head_dim, is_varlen, seqlen_k: rule(config, head_dim, is_varlen, 4096)
sys.exit(pytest.main(['-q', '-m', 'gpu', '-p', 'no:cacheprovider', 'tests/test_forward_hopper.py', '-k',
                      'shorter_than_a_block']))" > "$OUT/old-rule.log" 2>&1
echo "old rule (should fail) exit $?: $(tail -1 "$OUT/old-rule.log")"
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 300 tests/test_forward_hopper.py tests/test_varlen.py
export PYTHONPATH=src
timeout 170 python3 -m flashattn bench --providers flashattn flashattn_varlen flashattn_varlen_mixed --head-dims 128 \
  --seqlens 512 1024 16384 --varlen --out "$OUT/bench" --markdown "$OUT/bench/varlen.md" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
grep "^|" "$OUT/bench/varlen.md" | head -40
