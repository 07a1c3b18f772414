#!/usr/bin/env bash
# Call F: is the two-Q-tile fault about where Q lies in shared memory? Two Q tiles with Q allocated after the K/V
# ring (scratch/fwd_q_last.py: Q at 128 KB instead of 0); one Q tile with Q's allocation doubled
# (scratch/fwd_q_two_slots.py: Q at 0, as the two-tile build has it); each in its own process.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
S=benchmarks/results/20261124-session29
timeout 100 python3 $S/q_tiles_check.py scratch/fwd_q_last.py 2>&1 | tail -1
timeout 100 python3 $S/q_tiles_check.py one scratch/fwd_q_two_slots.py 2>&1 | tail -1
timeout 100 python3 $S/q_tiles_check.py scratch/fwd_q_two_slots.py 2>&1 | tail -1
