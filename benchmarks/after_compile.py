"""Why the first case timed after a compile reads slow (the bench's hdim-256 causal 512 forward: 141-196 TFLOP/s
right after its compile, 259 in a process whose Triton cache was warm). One process: compile the case's forward
(run with an empty TRITON_CACHE_DIR), then time it with demo.median_seconds (settled rounds) several times in a
row, then after ``gc.collect()``, after a sleep, and after a busy second. Prints TFLOP/s for each step.

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python3 benchmarks/after_compile.py --head-dim 256 \\
        --seqlen 512 --causal
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from flashattn import flash_attn_func
from flashattn.demo import median_seconds

TOKENS, HIDDEN = 16384, 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    batch, heads = max(1, TOKENS // args.seqlen), HIDDEN // args.head_dim
    q, k, v = (torch.randn(batch, args.seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    flops = 4 * batch * heads * args.seqlen**2 * args.head_dim / (2 if args.causal else 1)

    def forward():
        flash_attn_func(q, k, v, causal=args.causal)

    device = torch.device("cuda")
    started = time.perf_counter()
    forward()
    torch.cuda.synchronize()
    print(f"first call (compile): {time.perf_counter() - started:.2f} s; gc counts {gc.get_count()}, "
          f"tracked objects {len(gc.get_objects())}", flush=True)

    def timed(label: str) -> None:
        began = time.perf_counter()
        seconds = median_seconds(forward, device)
        print(f"{label}: {flops / seconds / 1e12:.1f} TFLOP/s ({time.perf_counter() - began:.2f} s)", flush=True)

    for index in range(3):
        timed(f"settled median {index + 1}")
    began = time.perf_counter()
    collected = gc.collect()
    print(f"gc.collect(): {collected} objects, {time.perf_counter() - began:.2f} s", flush=True)
    timed("after gc.collect()")
    time.sleep(2)
    timed("after a 2 s sleep")
    until = time.perf_counter() + 1
    while time.perf_counter() < until:
        forward()
    torch.cuda.synchronize()
    timed("after a busy second")


if __name__ == "__main__":
    main()
