#!/usr/bin/env bash
# Call I (H100): the split rule with the GPU's peak memory bandwidth (a launch below one wave splits only where its
# programs at 60 GB/s each fall short of it): the device's reported memory clock and bus width, the decode GPU tests,
# and the A/B of the rule (auto) against two splits (+s2) at batch 6-8, contiguous and paged.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src:tests
python3 -c "
import torch
from flashattn import decode_ops
p = torch.cuda.get_device_properties(0)
print(p.name, 'memory clock', getattr(p, 'memory_clock_rate', None), 'kHz, bus', getattr(p, 'memory_bus_width', None),
      'bits, peak', decode_ops.peak_memory_bandwidth(torch.device('cuda', 0)))
for batch in (4, 6, 7, 8):
    print('batch', batch, 'splits', decode_ops.gluon_decode_splits(batch * 8, 8192, p.multi_processor_count,
          decode_ops.peak_memory_bandwidth(torch.device('cuda', 0))))
"
source benchmarks/gpu_tests.sh
WORKERS=12 run_tests decode 170 tests/test_kvcache.py tests/test_combine.py tests/test_bench_decode.py tests/test_api.py \
  tests/test_launch_plans.py tests/test_varlen_paged.py
export PYTHONPATH=src
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 6 7 8 --variants auto auto+s2 \
  --rounds 3 --append > "$OUT/ab.log" 2>&1
echo "ab exit $?"
timeout 60 python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 --batches 8 --variants auto auto+s2 \
  --rounds 3 --append --page-size 256 > "$OUT/ab-paged.log" 2>&1
echo "ab paged exit $?"
grep "^| [0-9]" "$OUT/ab.log" "$OUT/ab-paged.log"
