"""Calls F-G: decode steps (GQA 32/8, hdim 128, bf16, with the append) through the Gluon kernel on a forced tile and
consumer count, checked against the Triton kernel on the same cache copy, then REPLAYS replays of a CUDA graph of 8
steps over the cache copies (as the bench times them). python3 stage_fault.py CACHE BATCH STAGES CONSUMERS [REPLAYS]"""
import sys

import torch

from flashattn import decode_ops, launcher
from flashattn.bench_decode import DecodeCase, flashattn_step, make_inputs

cache_len, batch, stages, consumers = (int(a) for a in sys.argv[1:5])
replays = int(sys.argv[5]) if len(sys.argv) > 5 else 0
copies = 4
inputs = make_inputs(DecodeCase(batch=batch, cache_len=cache_len), torch.device("cuda"), copies)
decode_ops.GLUON_DECODE = False
reference = flashattn_step(0)(inputs)(0).float()
decode_ops.GLUON_DECODE = True
decode_ops.GLUON_DECODE_TILE = (64, stages)
decode_ops.GLUON_DECODE_CONSUMERS = consumers
launcher.clear_plans()
step = flashattn_step(0)(inputs)
out = step(0).float()
torch.cuda.synchronize()
diff = (out - reference).abs().max().item()
print(f"{cache_len} x {batch}, 64 x {stages}, {consumers} consumers: max diff {diff:.3g}", flush=True)
if replays:
    for i in range(copies):
        step(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(8):
            step(i % copies)
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    print(f"{replays} graph replays done", flush=True)
