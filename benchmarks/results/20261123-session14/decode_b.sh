#!/usr/bin/env bash
# Call B: where a decode step's time goes (Nsight Compute, flashattn against cuDNN), and pointer loads with
# four stages against TMA at the large batches.
set -u
export PYTHONPATH=src:tests:benchmarks PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 240 python3 benchmarks/ncu_decode.py \
  --case ours-b64:provider=flashattn,batch=64,cache=4096 \
  --case tma4-b64:provider=flashattn,batch=64,cache=4096,config=64x4x4+tma,splits=1 \
  --case cudnn-b64:provider=sdpa_cudnn,batch=64,cache=4096 \
  --case ours-b1:provider=flashattn,batch=1,cache=8192 \
  --case cudnn-b1:provider=sdpa_cudnn,batch=1,cache=8192 > "$OUT/ncu.log" 2>&1
echo "ncu exit $?"
S=benchmarks/decode_splits.py
C="64x4x4+ptr 64x8x4+tma 32x4x6+tma"
{
timeout 150 python3 $S --cache-lens 4096 16384 --batches 64 --splits 1 2 3 --configs $C
timeout 100 python3 $S --cache-lens 65536 --batches 16 --splits 1 2 --configs $C
timeout 60 python3 $S --cache-lens 8192 --batches 1 --splits 16 32 --configs $C
} > "$OUT/sweeps.log" 2>&1
grep "^|" "$OUT/sweeps.log" | cut -c1-200; grep -i "error\|Traceback" "$OUT/sweeps.log" | head -5
cut -c1-400 "$OUT/ncu.log" | grep -v "^$" | head -60
