#!/usr/bin/env bash
# Call I: the Gluon dQ (16-byte stores) against the Triton dQ that the table keeps at 512 / 1k tokens, hdim 128.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
mkdir -p "$OUT"
SWEEPS=benchmarks/sweeps/dq-gluon-short-wide.txt REPEAT=2 LIMIT=80 bash benchmarks/gpu_sweeps.sh 2>&1 | grep -v "^      dq" | tail -30
