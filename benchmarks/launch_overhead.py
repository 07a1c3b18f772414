"""How much of a timed call is the host's launch work rather than the GPU's (GPU).

For each provider and shape it times the call as the bench does (``demo.median_seconds``: do_bench, L2
flushed before each call, so the GPU waits for the host's first launch), the same work replayed from a
CUDA graph (no host work), and the host's own time per call (calls issued back to back, no sync).
Where the first exceeds the second, the bench's figure includes launch overhead. Prints Markdown.

    PYTHONPATH=src python3 benchmarks/launch_overhead.py [--head-dims 128] [--seqlens 512 4096] [--causal 0 1]
"""

from __future__ import annotations

import argparse

import torch
from host_profile import host_us  # benchmarks/ is on sys.path when run as a script
from triton.testing import do_bench

from flashattn.bench import PROVIDERS
from flashattn.demo import median_seconds

TOKENS, HIDDEN = 16384, 2048
HOST_CALLS = 20


def graphed(fn):
    """fn captured in a CUDA graph (after warm-up on a side stream, as torch.cuda.graph asks): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def calls(provider: str, head_dim: int, seqlen: int, causal: bool):
    batch, heads = max(1, TOKENS // seqlen), HIDDEN // head_dim
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    fn = PROVIDERS[provider](q, k, v, causal)

    def forward():
        with torch.no_grad():
            return fn()

    out = fn()
    dout = torch.randn_like(out)
    return {"fwd": forward, "bwd": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[128])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[512, 4096])
    parser.add_argument("--causal", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--providers", nargs="+", default=["flashattn", "sdpa_flash", "sdpa_cudnn"])
    args = parser.parse_args()
    print("| hdim | seqlen | causal | provider | mode | bench ms | graph ms | bench / graph | host us/call |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            for causal in args.causal:
                for provider in args.providers:
                    for mode, fn in calls(provider, head_dim, seqlen, bool(causal)).items():
                        try:
                            bench_ms = median_seconds(fn, torch.device("cuda")) * 1e3
                            graph_ms = do_bench(graphed(fn), warmup=250, rep=100, return_mode="median")
                            host = host_us(fn, HOST_CALLS)
                        except Exception as exc:  # a provider that cannot be captured: say so, go on
                            print(f"| {head_dim} | {seqlen} | {causal} | {provider} | {mode} | "
                                  f"{type(exc).__name__}: {str(exc)[:80]} | | | |", flush=True)
                            continue
                        print(f"| {head_dim} | {seqlen} | {causal} | {provider} | {mode} | {bench_ms:.3f} | "
                              f"{graph_ms:.3f} | {bench_ms / graph_ms:.3f} | {host:.0f} |", flush=True)


if __name__ == "__main__":
    main()
