"""Where the host's time goes in one flashattn call (GPU): cProfile over back-to-back forward and
backward calls of a small problem, whose GPU time is shorter than the host's, so the host decides the
step time. Prints, with and without ``ops.DIRECT_EAGER_CALLS``, the host microseconds per call and the
bench's timing of the call, then the functions with the most own and cumulative time.

    PYTHONPATH=src python3 benchmarks/host_profile.py [--seqlen 512] [--head-dim 128] [--calls 200]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from flashattn import flash_attn_func, ops
from flashattn.demo import median_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    batch, heads = max(1, 16384 // args.seqlen), 2048 // args.head_dim
    q, k, v = (torch.randn(batch, args.seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)

    def forward():
        with torch.no_grad():
            flash_attn_func(q, k, v, causal=True)

    def backward():
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    for name, fn in (("forward", forward), ("backward", backward)):
        for direct in (True, False):
            ops.DIRECT_EAGER_CALLS = direct
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            host_us = (time.perf_counter() - start) / args.calls * 1e6
            bench_ms = median_seconds(fn, torch.device("cuda")) * 1e3
            print(f"{name}, direct eager calls {direct}: {host_us:.0f} us of host time per call, "
                  f"bench timing {bench_ms:.3f} ms", flush=True)
        ops.DIRECT_EAGER_CALLS = True
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls):
            fn()
        profiler.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(profiler)
        print(f"=== {name}: {stats.total_tt / args.calls * 1e6:.0f} us of host time per call")
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
