#!/usr/bin/env bash
# Call F (H200): the rule widened to causal calls with more queries than keys. The short-key GPU test under session
# 22's rule (two Q tiles on every dense persistent grid with room), then test_forward_hopper under the tree's.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
timeout 100 python3 -c "
import sys, pytest
import flashattn.ops as ops
rule = ops._forward_q_buffers
ops._forward_q_buffers = lambda config, head_dim, causal, is_varlen, seqlen_q, seqlen_k: rule(
    config, head_dim, False, is_varlen, 4096, 4096)
sys.exit(pytest.main(['-q', '-m', 'gpu', '-p', 'no:cacheprovider', '-rf', 'tests/test_forward_hopper.py', '-k',
                      'no_whole_block']))" > "$OUT/old-rule.log" 2>&1
echo "old rule exit $?: $(tail -1 "$OUT/old-rule.log")"
grep "^FAILED" "$OUT/old-rule.log" | cut -c1-140
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests forward 300 tests/test_forward_hopper.py
