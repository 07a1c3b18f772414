"""Where a decode step's time goes: the GPU time of each kernel of ``flash_attn_with_kvcache`` (GPU).

The bench times whole steps in a CUDA graph; this splits one step (append, attention, merge) by kernel
with torch.profiler, for the cells where flashattn trails cuDNN (``--cudnn``: cuDNN's kernels on the same contiguous
cache too). Prints a Markdown table.

    PYTHONPATH=src python3 benchmarks/decode_profile.py --batches 1 4 --cache-lens 8192 65536 [--page-size 256]
        [--num-splits 0 8 16 32] [--cudnn]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from flashattn.bench_decode import (
    DECODE_PROVIDERS,
    DecodeCase,
    choose_grid_copies,
    flashattn_step,
    l2_bytes,
    make_inputs,
)

STEPS = 20


def kernel_times(case: DecodeCase, num_splits: int, provider: str = "flashattn") -> dict[str, float]:
    """Mean GPU microseconds per step of each kernel, over STEPS steps after a warm-up: flashattn's step with
    ``num_splits`` (0: automatic), or another of the bench's providers (``sdpa_cudnn``).

    The steps cycle over as many cache copies as the bench's graph does (together at least 4x the L2),
    so that each step reads its cache from HBM, as in the bench, and not from the L2.
    """
    device = torch.device("cuda")
    copies = choose_grid_copies(case.kv_bytes(), l2_bytes(device))
    build = flashattn_step(num_splits) if provider == "flashattn" else DECODE_PROVIDERS[provider]
    step = build(make_inputs(case, device, copies=copies))

    for i in range(copies):
        step(i)
    return gpu_time_by_kernel(lambda i: step(i % copies), STEPS)


def gpu_time_by_kernel(run: Callable[[int], object], calls: int) -> dict[str, float]:
    """Mean GPU microseconds per call of each CUDA kernel over run(0), ..., run(calls - 1), from
    torch.profiler; the caller warms up first. backward_profile.py uses it too."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            run(i)
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / calls
    return dict(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--cache-lens", nargs="+", type=int, default=[8192, 65536])
    parser.add_argument("--page-size", type=int, default=0, help="0: a contiguous cache")
    parser.add_argument("--num-splits", nargs="+", type=int, default=[0],
                        help="split counts to profile in turn; 0: the automatic choice")
    parser.add_argument("--cudnn", action="store_true", help="cuDNN's kernels on the contiguous cache too")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_profile.py needs a CUDA GPU")
    print("| cache | batch | splits | kernel | us per step |\n|---|---|---|---|---|")
    for cache_len in args.cache_lens:
        for batch in args.batches:
            case = DecodeCase(batch=batch, cache_len=cache_len, page_size=args.page_size or None)
            runs = [(num_splits, "flashattn") for num_splits in args.num_splits]
            if args.cudnn and not args.page_size:
                runs.append((0, "sdpa_cudnn"))
            for num_splits, provider in runs:
                times = kernel_times(case, num_splits, provider)
                label = (num_splits or "auto") if provider == "flashattn" else provider
                for name, micros in sorted(times.items(), key=lambda item: -item[1]):
                    print(f"| {cache_len} | {batch} | {label} | {name[:60]} | {micros:.1f} |")
                print(f"| {cache_len} | {batch} | {label} | **sum** | {sum(times.values()):.1f} |", flush=True)


if __name__ == "__main__":
    main()
