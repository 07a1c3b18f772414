"""Where the backward's time goes: the GPU time of each of its kernels (delta, dK/dV, dQ) on the bench's
grid (16k tokens, heads x hdim = 2048, bf16), from torch.profiler (GPU).

The bench times the whole backward; this splits it by kernel, which is what a change to one kernel (a dQ
folded into the dK/dV pass, say) has to be weighed against. Prints a Markdown table.

    PYTHONPATH=src python3 benchmarks/backward_profile.py [--head-dims 64 128 256] [--seqlens 4096]
        [--causal 0 1]
"""

from __future__ import annotations

import argparse

import torch
from decode_profile import gpu_time_by_kernel  # benchmarks/ is on sys.path when run as a script

from flashattn import flash_attn_func

TOKENS, HIDDEN = 16384, 2048
STEPS = 10


def kernel_times(head_dim: int, seqlen: int, causal: bool) -> dict[str, float]:
    """Mean GPU milliseconds per backward of each kernel, after a warm-up."""
    batch, heads = max(1, TOKENS // seqlen), HIDDEN // head_dim
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)

    def backward():
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    for _ in range(5):
        backward()
    return {name: us / 1e3 for name, us in gpu_time_by_kernel(lambda _: backward(), STEPS).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128, 256])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[4096])
    parser.add_argument("--causal", nargs="+", type=int, default=[0, 1])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("backward_profile.py needs a CUDA GPU")
    print("| hdim | seqlen | causal | kernel | ms | share |\n|---|---|---|---|---|---|")
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            for causal in args.causal:
                times = kernel_times(head_dim, seqlen, bool(causal))
                total = sum(times.values())
                for name, ms in sorted(times.items(), key=lambda item: -item[1]):
                    print(f"| {head_dim} | {seqlen} | {causal} | {name[:40]} | {ms:.3f} | {ms / total:.0%} |",
                          flush=True)


if __name__ == "__main__":
    main()
