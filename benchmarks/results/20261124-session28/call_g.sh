#!/usr/bin/env bash
# Call G (H200, 6146c8c, call F's lease): call F's old-rule failures past its illegal address were collateral; each
# causal / 200-key form under session 22's rule (two Q tiles) in a process of its own
export PYTHONPATH=src:tests; mkdir -p $OUT
for id in 1024x77-causal-n128-s2-persistent 1024x200-causal-n128-s2-persistent 1024x200-plain-n128-s2-persistent; do
  timeout 45 python3 -c "
import sys, pytest
import flashattn.ops as ops
rule = ops._forward_q_buffers
ops._forward_q_buffers = lambda config, head_dim, causal, is_varlen, seqlen_q, seqlen_k: rule(config, head_dim, False, is_varlen, 4096, 4096)
sys.exit(pytest.main(['-q', '-m', 'gpu', '-p', 'no:cacheprovider', 'tests/test_forward_hopper.py::test_ws_forward_tiles_that_may_see_no_whole_block[$id]']))" > $OUT/$id.log 2>&1
  echo "$id exit $?: $(tail -1 $OUT/$id.log)"
done
