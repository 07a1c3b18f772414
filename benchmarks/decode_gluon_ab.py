"""The Gluon decode kernel against the Triton one and cuDNN (GPU, sm90): decode steps with nothing to append (the
attention SDPA runs), timed as the bench times them (a CUDA graph over enough cache copies to miss L2), in rounds
that alternate the providers. Each Gluon output is checked against the Triton kernel's.

    PYTHONPATH=src python3 benchmarks/decode_gluon_ab.py --cache-lens 4096 8192 16384 --batches 1 4 16 \\
        --variants auto 64x4 128x3 --rounds 2 [--append]

A variant is BLOCK_NxSTAGES of the Gluon kernel (``decode_ops.GLUON_DECODE_TILE``), or "auto" (its rule,
``gluon_decode_tile``); suffixes: "+sN" runs N splits (``GLUON_DECODE_SPLITS``), "+everywhere" lifts the table's
gates on programs and cache bytes per SM (``_gluon_decode_fits``), "+rows" pads the group's query rows to wgmma's 64
instead of swapping the products (``GLUON_DECODE_SWAPPED`` off), "+c1" one swapped consumer instead of two
(``GLUON_DECODE_CONSUMERS``), "+chainedmerge" a split step's merge launched chained (``GLUON_DECODE_MERGE_CHAINED``),
"+early" / "+late" the sequence's length read in the partitions, split 0's first block copied before it arrives,
or read before them (``GLUON_DECODE_EARLY_FIRST_BLOCK``; by default ``gluon_decode_early_first_block``), "+base" the
kernel of ``--base-kernel`` (another version of ``kernels/decode_hopper.py`` that takes the same arguments: an
earlier commit's, ``git show COMMIT:src/flashattn/kernels/decode_hopper.py > FILE``) instead of the tree's.
``--append``: steps that append the new key (the bench's flashattn column) for the Triton and Gluon kernels; cuDNN's
never does. Prints a Markdown table of microseconds per step (median over rounds) and the ratios to cuDNN.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
from module_file import load_module_file

from flashattn import decode_ops, launcher
from flashattn.bench_decode import (
    DECODE_PROVIDERS,
    DecodeCase,
    choose_grid_copies,
    flashattn_step,
    graph_seconds,
    l2_bytes,
    make_inputs,
)
from flashattn.kernels import decode_hopper

WRONG_DIFF = 2e-2  # bf16 outputs of the same attention differ by rounding only
BASE_KERNELS = {}  # "+base": the kernel of --base-kernel


def load_base_kernel(path: str) -> None:
    """The Gluon decode kernel of the file ``path`` (a version of ``kernels/decode_hopper.py``), for "+base" variants:
    loaded as a module of ``flashattn.kernels``, so that its relative imports resolve."""
    module = load_module_file(path, "flashattn.kernels.decode_hopper_base")
    BASE_KERNELS["kernel"] = module.kvcache_decode_hopper_kernel


@contextlib.contextmanager
def gluon(variant: str | None):
    """The Gluon kernel (paged caches too) with tile ``variant`` ("64x4", "auto"), or the Triton kernel everywhere
    (None); launch plans cleared around."""
    names = ("GLUON_DECODE", "GLUON_DECODE_PAGED", "GLUON_DECODE_TILE", "GLUON_DECODE_SPLITS",
             "GLUON_DECODE_MAX_PROGRAMS_PER_PROCESSOR", "GLUON_DECODE_MAX_BYTES_PER_PROCESSOR",
             "GLUON_DECODE_SWAPPED", "GLUON_DECODE_CONSUMERS", "GLUON_DECODE_MERGE_CHAINED",
             "GLUON_DECODE_EARLY_FIRST_BLOCK")
    saved = {name: getattr(decode_ops, name) for name in names}
    tree_kernel = decode_hopper.kvcache_decode_hopper_kernel
    if variant is None:
        decode_ops.GLUON_DECODE = False
    else:
        tile, *flags = variant.split("+")
        decode_ops.GLUON_DECODE, decode_ops.GLUON_DECODE_PAGED = True, True
        decode_ops.GLUON_DECODE_TILE = None if tile == "auto" else tuple(int(part) for part in tile.split("x"))
        if "everywhere" in flags:  # past the table's gates on programs and bytes per SM
            decode_ops.GLUON_DECODE_MAX_PROGRAMS_PER_PROCESSOR = float("inf")
            decode_ops.GLUON_DECODE_MAX_BYTES_PER_PROCESSOR = float("inf")
        decode_ops.GLUON_DECODE_SWAPPED = "rows" not in flags
        decode_ops.GLUON_DECODE_CONSUMERS = 1 if "c1" in flags else 2
        decode_ops.GLUON_DECODE_MERGE_CHAINED = "chainedmerge" in flags
        decode_ops.GLUON_DECODE_EARLY_FIRST_BLOCK = True if "early" in flags else False if "late" in flags else None
        splits = [int(flag[1:]) for flag in flags if flag.startswith("s") and flag[1:].isdigit()]
        decode_ops.GLUON_DECODE_SPLITS = splits[0] if splits else None
        if "base" in flags:  # decode_ops imports the kernel from its module at each launch
            decode_hopper.kvcache_decode_hopper_kernel = BASE_KERNELS["kernel"]
    launcher.clear_plans()
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(decode_ops, name, value)
        decode_hopper.kvcache_decode_hopper_kernel = tree_kernel
        launcher.clear_plans()


def time_case(case: DecodeCase, variants: list[str], rounds: int, device: torch.device, append: bool,
              scatter_pages: bool = True) -> dict:
    copies = choose_grid_copies(case.kv_bytes(), l2_bytes(device))
    inputs = make_inputs(case, device, copies, scatter_pages)
    reference = flashattn_step(0, append=append)(inputs)(0).float()
    # SDPA has no paged cache: cuDNN runs on a contiguous cache of the same shape
    sdpa_inputs = make_inputs(DecodeCase(batch=case.batch, cache_len=case.cache_len), device, copies) \
        if case.page_size else inputs
    names = ["triton", *variants, "cudnn"]
    times: dict[str, list[float]] = {name: [] for name in names}
    wrong = {}
    for _ in range(rounds):
        for name in names:
            if name == "cudnn":
                step = DECODE_PROVIDERS["sdpa_cudnn"](sdpa_inputs)
                times[name].append(graph_seconds(step, copies, device) * 1e6)
                continue
            with gluon(None if name == "triton" else name):
                step = flashattn_step(0, append=append)(inputs)
                diff = (step(0).float() - reference).abs().max().item()
                if diff > WRONG_DIFF:
                    wrong[name] = diff
                torch.cuda.synchronize(device)
                times[name].append(graph_seconds(step, copies, device) * 1e6)
    del inputs, sdpa_inputs
    torch.cuda.empty_cache()
    return {"us": {name: statistics.median(runs) for name, runs in times.items()}, "runs": times, "wrong": wrong}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--cache-lens", nargs="+", type=int, default=[4096, 8192, 16384])
    parser.add_argument("--variants", nargs="+", default=["64x6"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--append", action="store_true", help="steps that append the new key and value")
    parser.add_argument("--page-size", type=int, default=0, help="a paged cache of these pages (0: contiguous)")
    parser.add_argument("--pages-in-order", action="store_true",
                        help="a sequence's pages one after the other in the pool (default: scattered at random)")
    parser.add_argument("--base-kernel", default=None, help="the kernel file of \"+base\" variants")
    args = parser.parse_args()
    if args.base_kernel:
        load_base_kernel(args.base_kernel)
    device = torch.device("cuda")
    names = ["triton", *args.variants, "cudnn"]
    print("| cache | batch | " + " | ".join(f"{n} us" for n in names) + " | "
          + " | ".join(f"{n} / cudnn" for n in names[:-1]) + f" | {names[1]} / cudnn, rounds |")
    print("|---" * (2 + 2 * len(names)) + "|")
    for cache_len in args.cache_lens:
        for batch in args.batches:
            case = DecodeCase(batch=batch, cache_len=cache_len, page_size=args.page_size or None)
            result = time_case(case, args.variants, args.rounds, device, args.append, not args.pages_in_order)
            us, runs = result["us"], result["runs"]
            ratios = [f"{us['cudnn'] / us[n]:.3f}" for n in names[:-1]]  # > 1: faster than cuDNN
            # the first variant's ratio round by round (each round times every provider once, in turn)
            per_round = [cudnn / ours for cudnn, ours in zip(runs["cudnn"], runs[names[1]], strict=True)]
            ratios.append(f"{min(per_round):.3f}-{max(per_round):.3f}")
            flag = f" WRONG {result['wrong']}" if result["wrong"] else ""
            print(f"| {cache_len} | {batch} | " + " | ".join(f"{us[n]:.1f}" for n in names) + " | "
                  + " | ".join(ratios) + f" |{flag}", flush=True)


if __name__ == "__main__":
    main()
