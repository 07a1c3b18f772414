"""Where the host's time goes in one flashattn call (GPU): cProfile over back-to-back forward and
backward calls of a small problem, whose GPU time is shorter than the host's, so the host decides the
step time. Prints the backward's host time layer by layer, then, with and without
``ops.DIRECT_EAGER_CALLS``, the host microseconds per call and the bench's timing of the call, then the
functions with the most own and cumulative time.

    PYTHONPATH=src python3 benchmarks/host_profile.py [--seqlen 512] [--head-dim 128] [--calls 200]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from flashattn import flash_attn_func, ops
from flashattn.bench import host_microseconds
from flashattn.demo import median_seconds


def host_us(fn, calls: int) -> float:
    """Host microseconds per call, ``calls`` calls issued back to back after a warm-up (the bench's measure)."""
    return host_microseconds(fn, torch.device("cuda"), calls)


class IdentityFunction(torch.autograd.Function):
    """The cheapest autograd.Function: what the engine costs around any backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def backward_breakdown(q, k, v, out, dout, calls: int) -> None:
    """Host time of the backward's layers: the whole autograd call, the CUDA implementation called
    directly, an empty autograd.Function's backward, and one Triton launch (the delta kernel's)."""
    from flashattn.kernels.backward import delta_kernel
    from flashattn.options import AttentionOptions

    opts = AttentionOptions.build(q.shape[-1], None, True, (-1, -1), 0.0, 0.0, False)
    with torch.no_grad():
        _, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    x = torch.randn(8, device="cuda", requires_grad=True)
    y = IdentityFunction.apply(x)
    grad_y = torch.ones_like(y)
    delta = torch.empty_like(lse)
    rows, heads = q.shape[1], q.shape[2]
    strides = (out.stride(0), out.stride(1), out.stride(2))
    rows_blocks = -(-rows // 64)

    def launch_delta():
        delta_kernel[(rows_blocks, q.shape[0] * heads)](out, dout, delta, *strides, *strides, rows, heads,
                                                       HEAD_DIM=q.shape[-1], BLOCK_D=q.shape[-1], BLOCK_M=64)

    parts = {
        "autograd.grad of the attention": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
        "attention_backward_cuda, direct": lambda: ops.attention_backward_cuda(
            dout, q, k, v, out, lse, None, None, *ops.op_arguments(opts)),
        "autograd.grad of an empty Function": lambda: torch.autograd.grad(y, x, grad_y, retain_graph=True),
        "one Triton launch (delta kernel)": launch_delta,
    }
    for name, fn in parts.items():
        print(f"backward breakdown: {name}: {host_us(fn, calls):.0f} us of host time per call", flush=True)


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

    backward_breakdown(q, k, v, out, dout, args.calls)
    for name, fn in (("forward", forward), ("backward", backward)):
        for direct in (True, False):
            ops.DIRECT_EAGER_CALLS = direct
            host = host_us(fn, args.calls)
            bench_ms = median_seconds(fn, torch.device("cuda")) * 1e3
            print(f"{name}, direct eager calls {direct}: {host:.0f} us of host time per call, "
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
