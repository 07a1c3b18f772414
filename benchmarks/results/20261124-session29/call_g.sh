#!/usr/bin/env bash
# Call G: (1) two Q tiles, the loader kept from running ahead (scratch/fwd_no_run_ahead.py: it also waits for the
# tile before's release, as with one Q tile); (2) the debug kernel's l and O sums against a masked and an unmasked
# reference (the whole 128-key block).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT" scratch
S=benchmarks/results/20261124-session29
timeout 100 python3 $S/q_tiles_check.py scratch/fwd_no_run_ahead.py 2>&1 | tail -1
python3 $S/make_debug_kernel.py
timeout 150 python3 $S/q_tiles_debug.py > "$OUT/debug-two.log" 2>&1
echo "debug exit $?"; grep -E -A1 "product issues" "$OUT/debug-two.log" | head -16; grep problems "$OUT/debug-two.log"
