"""A/B of one module-level switch of flashattn (a bool such as ``flashattn.ops.CONCURRENT_GRADIENTS``) on the
bench's grid shapes (16k tokens, heads x hdim = 2048, bf16): the forward or the backward timed with the switch
on and off, alternating within each round, so that both see the same lease, clocks and L2 state.

Prints a Markdown table of TFLOP/s per round and the ratio of the medians (on / off).

    PYTHONPATH=src python3 benchmarks/ab_flag.py --flag flashattn.ops:CONCURRENT_GRADIENTS \\
        --cases 64:2048:0 64:16384:1 128:4096:0 --mode bwd --rounds 3

With ``--off-from FILE`` the attribute is a kernel (or any object) instead: "on" is the tree's, "off" the one of
the same name in FILE, an earlier copy of the module, loaded beside it so that its relative imports resolve:

    PYTHONPATH=src python3 benchmarks/ab_flag.py --flag flashattn.kernels.backward:dq_kernel \\
        --off-from old_backward.py --cases 64:16384:1
"""

from __future__ import annotations

import argparse
import importlib
import statistics

import torch
from module_file import load_module_file

from flashattn import flash_attn_func, launcher
from flashattn.demo import median_seconds

TOKENS, HIDDEN = 16384, 2048


def parse_case(text: str) -> tuple[int, int, bool]:
    head_dim, seqlen, causal = text.split(":")
    return int(head_dim), int(seqlen), causal == "1"


def runner(head_dim: int, seqlen: int, causal: bool, mode: str):
    """A closure that runs the forward (no grad) or the backward of one grid case, and its FLOP count."""
    batch, heads = max(1, TOKENS // seqlen), HIDDEN // head_dim
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    if mode == "fwd":
        def forward():
            with torch.no_grad():
                flash_attn_func(q, k, v, causal=causal)
        return forward, flops
    out = flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    return (lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)), 2.5 * flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flag", required=True, help="module:NAME of a bool switch")
    parser.add_argument("--cases", nargs="+", type=parse_case, required=True, help="hdim:seqlen:causal")
    parser.add_argument("--mode", choices=("fwd", "bwd"), default="bwd")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--off-from", help="a copy of the flag's module whose attribute of that name is 'off'")
    args = parser.parse_args()
    module_name, name = args.flag.split(":")
    module = importlib.import_module(module_name)
    settings = {True: True, False: False}
    if args.off_from:
        earlier = load_module_file(args.off_from, module_name + "_off")
        settings = {True: getattr(module, name), False: getattr(earlier, name)}
    device = torch.device("cuda")
    print(f"| hdim | seqlen | causal | {name} on, TFLOP/s | off | on / off |\n|---|---|---|---|---|---|")
    for head_dim, seqlen, causal in args.cases:
        run, flops = runner(head_dim, seqlen, causal, args.mode)
        timings: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for value in (True, False):
                setattr(module, name, settings[value])
                launcher.clear_plans()  # a recorded plan would replay the other setting's launches
                timings[value].append(median_seconds(run, device))
        setattr(module, name, settings[True])
        on, off = ([flops / seconds / 1e12 for seconds in timings[value]] for value in (True, False))
        print(f"| {head_dim} | {seqlen} | {int(causal)} | {' / '.join(f'{x:.1f}' for x in on)} | "
              f"{' / '.join(f'{x:.1f}' for x in off)} | {statistics.median(on) / statistics.median(off):.3f} |",
              flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
