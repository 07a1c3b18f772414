#!/usr/bin/env bash
# Call H: benchmarks/after_compile.py on the two cells that read slow right after their compile (hdim 256 causal 512,
# Gluon; hdim 128 non-causal 512, persistent Gluon), each in a process with an empty Triton cache, then with a warm one.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
for case in "--head-dim 256 --seqlen 512 --causal" "--head-dim 128 --seqlen 512"; do
  cache=$(mktemp -d)
  echo "== $case, empty cache"; TRITON_CACHE_DIR=$cache timeout 100 python3 benchmarks/after_compile.py $case
  echo "== $case, warm cache"; TRITON_CACHE_DIR=$cache timeout 100 python3 benchmarks/after_compile.py $case
done 2>&1 | grep -v Warning | tee "$OUT/after_compile.txt"
