"""Sweep the split count of a decode step (GPU): the data behind ``decode_ops.choose_num_splits``.

For each case (cache length, batch, contiguous or paged) the whole step of ``flash_attn_with_kvcache``
is timed as the bench times it (a CUDA graph over enough cache copies to miss the L2), once per split
count, and the automatic choice is marked. Prints a Markdown table per case and writes JSON to --out.

    PYTHONPATH=src python3 benchmarks/decode_splits.py --cache-lens 8192 65536 --batches 1 4 16 \\
        [--page-size 256] --out splits.json
"""

from __future__ import annotations

import argparse
import json

import torch

from flashattn import decode_ops
from flashattn.bench_decode import DecodeCase, choose_grid_copies, flashattn_step, graph_seconds, l2_bytes, make_inputs

SPLIT_CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 16, 17, 22, 24, 32, 33, 48, 64)


def candidate_splits(case: DecodeCase, processors: int, key_block: int = 64) -> list[int]:
    """Split counts worth timing: every split keeps at least 2 key blocks, and the launch has from half
    a program to 4 programs per processor, or up to 4 splits where the batch alone fills the GPU (the
    waves of a large batch)."""
    programs = case.batch * case.nheads_k
    key_blocks = -(-case.cache_len // key_block)
    return [s for s in SPLIT_CANDIDATES
            if s <= max(1, key_blocks // 2) and processors // 2 <= programs * s
            and (programs * s <= 4 * processors or s <= 4)]


def sweep(case: DecodeCase, device: torch.device) -> dict:
    processors = torch.cuda.get_device_properties(device).multi_processor_count
    copies = choose_grid_copies(case.kv_bytes(), l2_bytes(device))
    inputs = make_inputs(case, device, copies)
    key_blocks = -(-case.cache_len // 64)
    auto = decode_ops.choose_num_splits(case.batch * case.nheads_k, key_blocks, processors)
    times = {}
    for splits in sorted(set(candidate_splits(case, processors)) | {auto}):
        step = flashattn_step(splits)(inputs)
        step(0)
        torch.cuda.synchronize(device)
        times[splits] = graph_seconds(step, copies, device) * 1e6
    del inputs
    torch.cuda.empty_cache()
    return {"case": vars(case), "auto": auto, "us": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--cache-lens", nargs="+", type=int, default=[8192, 65536])
    parser.add_argument("--page-size", type=int, default=0, help="0: a contiguous cache")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_splits.py needs a CUDA GPU")
    device = torch.device("cuda")
    results = []
    for cache_len in args.cache_lens:
        for batch in args.batches:
            result = sweep(DecodeCase(batch=batch, cache_len=cache_len, page_size=args.page_size or None), device)
            results.append(result)
            best = min(result["us"], key=result["us"].get)
            cells = " ".join(f"{s}{'*' if s == result['auto'] else ''}{'!' if s == best else ''}:{us:.1f}"
                             for s, us in result["us"].items())
            print(f"| {cache_len} | {batch} | {args.page_size or 'contiguous'} | auto {result['auto']} "
                  f"{result['us'][result['auto']]:.1f} us | best {best} {result['us'][best]:.1f} us | {cells} |",
                  flush=True)
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"device": torch.cuda.get_device_name(device), "results": results}, file, indent=1)


if __name__ == "__main__":
    main()
