#!/usr/bin/env bash
# Call B: where a decode step's GPU time goes at batch 1-16 (torch.profiler, eager steps over cache copies that miss
# L2): each kernel of flashattn's step (new keys first) beside cuDNN's on the same contiguous cache; then split
# counts around the automatic one at batch 2-8.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_profile.py --cache-lens 4096 8192 --batches 1 2 4 8 16 --cudnn \
  > "$OUT/profile.log" 2>&1
echo "profile exit $?"
timeout 150 python3 benchmarks/decode_profile.py --cache-lens 4096 --batches 2 4 8 --num-splits 0 1 2 3 4 6 \
  > "$OUT/profile-splits.log" 2>&1
echo "profile splits exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/profile*.log | head -20
grep "^|" "$OUT/profile.log"; grep -E "^\| (cache|.*\*\*sum)" "$OUT/profile-splits.log"
