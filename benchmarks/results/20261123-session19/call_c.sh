#!/usr/bin/env bash
# Call C: kernel-only timing of the key-slice dK/dV variants (dkdv_variants.py): the use_acc predicate in the loop
# (call A's form), gradients zeroed at each tile's start (this tree), and that with dS formed after the products'
# wait (as ptxas scheduled session 18's kernel), each on one tile a program and persistent.
set -u
export PYTHONPATH=src:tests:benchmarks:benchmarks/results/20261123-session19 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 300 python3 benchmarks/results/20261123-session19/dkdv_variants.py ${VARIANTS:-predicate tree late_ds} > "$OUT/variants.log" 2>&1
echo "variants exit $?"; cat "$OUT/variants.log" | tail -40
