"""Call F: one decode step (GQA 32/8, hdim 128, bf16, with the append) through the Gluon kernel on a forced tile and
consumer count, checked against the Triton kernel. python3 stage_fault.py CACHE BATCH STAGES CONSUMERS"""
import sys

import torch

from flashattn import decode_ops, launcher
from flashattn.bench_decode import DecodeCase, flashattn_step, make_inputs

cache_len, batch, stages, consumers = (int(a) for a in sys.argv[1:5])
inputs = make_inputs(DecodeCase(batch=batch, cache_len=cache_len), torch.device("cuda"), 2)
decode_ops.GLUON_DECODE = False
reference = flashattn_step(0)(inputs)(0).float()
decode_ops.GLUON_DECODE = True
decode_ops.GLUON_DECODE_TILE = (64, stages)
decode_ops.GLUON_DECODE_CONSUMERS = consumers
launcher.clear_plans()
out = flashattn_step(0)(inputs)(1).float()
torch.cuda.synchronize()
print(f"{cache_len} x {batch}, 64 x {stages}, {consumers} consumers: max diff {(out - reference).abs().max().item():.3g}")
