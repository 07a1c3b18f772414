"""Host time of one short forward call, by function (cProfile over many calls)."""
import cProfile
import pstats
import sys

import torch

from flashattn import flash_attn_func

for head_dim, causal in ((128, False), (64, True)):
    q, k, v = (torch.randn(32, 512, 2048 // head_dim, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        for _ in range(50):
            flash_attn_func(q, k, v, causal=causal)
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(1000):
            flash_attn_func(q, k, v, causal=causal)
        profiler.disable()
        torch.cuda.synchronize()
    print(f"=== hdim {head_dim} causal {causal}: per call, 1000 calls")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(28)
