#!/usr/bin/env bash
# Call B (H200, a242334): where packed non-causal calls with two Q tiles go wrong
mkdir -p $OUT; PYTHONPATH=src timeout 400 python3 benchmarks/results/20261124-session28/q_buffers_diag.py 2>&1 | tee $OUT/diag.log | tail -80
