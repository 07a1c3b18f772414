#!/usr/bin/env bash
# Call J (H200): the split rule with the peak memory bandwidth on an H200: its reported memory clock and bus width, the
# split counts it gives (batch 8 must still split there), and a short A/B of the rule against unsplit (+s1) at batch 8.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
python3 -c "
import torch
from flashattn import decode_ops
p = torch.cuda.get_device_properties(0)
print(p.name, 'memory clock', getattr(p, 'memory_clock_rate', None), 'kHz, bus', getattr(p, 'memory_bus_width', None),
      'bits, peak', decode_ops.peak_memory_bandwidth(torch.device('cuda', 0)))
for batch in (4, 6, 7, 8, 9):
    print('batch', batch, 'splits', decode_ops.gluon_decode_splits(batch * 8, 8192, p.multi_processor_count,
          decode_ops.peak_memory_bandwidth(torch.device('cuda', 0))))
"
timeout 100 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 16384 --batches 8 --variants auto auto+s1 \
  --rounds 3 --append > "$OUT/ab.log" 2>&1
echo "ab exit $?"
grep "^| [0-9]" "$OUT/ab.log"
