"""Sweep the split count of a decode step (GPU): the data behind ``flashattn.configs.choose_num_splits`` and
``flashattn.configs.hopper_decode_splits``.

For each case (cache length, batch, contiguous or paged) the whole step of ``flash_attn_with_kvcache``
is timed as the bench times it (a CUDA graph over enough cache copies to miss the L2), once per split
count, and the automatic choice is marked; with --configs, also for other key tiles, warps and stages of
the Triton decode kernel (``flashattn.configs.decode_config``), each output checked against the table's.
Steps that the Hopper kernels take (``flashattn.launch.decode.hopper_decode_fits``) choose their own tiles:
there --configs changes nothing. Prints a Markdown row per case and config, JSON to --out.

    PYTHONPATH=src python3 benchmarks/decode_splits.py --cache-lens 8192 65536 --batches 1 4 16 \\
        [--page-size 256] --out splits.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json

import torch

from flashattn import configs
from flashattn.launch import clear_plans
from flashattn.launch.common import peak_memory_bandwidth
from flashattn.launch.decode import _paged_geometry, hopper_decode_fits
from flashattn.options import AttentionOptions
from flashattn.tools.bench_decode import (
    DecodeCase,
    choose_grid_copies,
    flashattn_step,
    graph_seconds,
    l2_bytes,
    make_inputs,
)

WRONG_DIFF = 2e-2  # bf16 outputs of the same attention differ by rounding only (~1e-3)
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


def parse_config(text: str) -> dict:
    """"64x4x3" -> the DecodeConfig fields block_n, num_warps, num_stages; the flag "+nostream" after it: no
    streaming stages (unsplit launches keep num_stages). The query tile stays the table's."""
    tiles, *flags = text.split("+")
    block_n, warps, stages = (int(part) for part in tiles.split("x"))
    fields = dict(block_n=block_n, num_warps=warps, num_stages=stages)
    for flag in flags:
        if flag == "nostream":
            fields["streaming_stages"] = 0
        else:
            raise ValueError(f"config {text!r}: unknown flag {flag!r} (expected nostream)")
    return fields


@contextlib.contextmanager
def decode_tiles(config: dict | None):
    """configs.decode_config with the fields of ``config`` replaced; None: the table's. The launch plans are
    cleared on the way in and out: their key does not see the patched function."""
    table = configs.decode_config
    if config is not None:
        configs.decode_config = lambda *args: dataclasses.replace(table(*args), **config)
    clear_plans()
    try:
        yield
    finally:
        configs.decode_config = table
        clear_plans()


def automatic_splits(case: DecodeCase, inputs, device: torch.device, processors: int) -> tuple[int, str]:
    """The split count that ``flash_attn_with_kvcache`` chooses for ``case`` (num_splits=0), and the kernel that
    runs the step: "hopper" or "triton"."""
    k_cache, v_cache = inputs.k_caches[0], inputs.v_caches[0]
    options = AttentionOptions.build(case.head_dim, None, True, (-1, -1), 0.0, 0.0, False)
    programs = case.batch * case.nheads_k
    if hopper_decode_fits(inputs.q, k_cache, v_cache, None, None, inputs.block_table, None, None, options,
                          inputs.k_new):
        capacity = _paged_geometry(k_cache, inputs.block_table)["capacity"]
        return configs.hopper_decode_splits(programs, capacity, processors, peak_memory_bandwidth(device)), "hopper"
    config = configs.decode_config(case.nheads // case.nheads_k, case.head_dim, getattr(torch, case.dtype), False)
    key_blocks = -(-case.cache_len // config.block_n)
    return configs.choose_num_splits(programs, key_blocks, processors, config.streaming_stages > 0), "triton"


def sweep(case: DecodeCase, device: torch.device, tile_configs: list[str | None],
          only_splits: list[int] | str = ()) -> dict:
    """Step times over split counts for each tile config, and each output's largest difference from
    the table config's output with the automatic split count (a wrong config shows there). ``only_splits``:
    time these split counts (and the automatic one) instead of :func:`candidate_splits`; "auto": the automatic one
    only."""
    processors = torch.cuda.get_device_properties(device).multi_processor_count
    copies = choose_grid_copies(case.kv_bytes(), l2_bytes(device))
    inputs = make_inputs(case, device, copies)
    auto, kernel = automatic_splits(case, inputs, device, processors)
    reference = flashattn_step(auto)(inputs)(0).float()
    results = {}
    for name in tile_configs:
        config = parse_config(name) if name else None
        times, diffs = {}, {}
        with decode_tiles(config):
            if only_splits == "auto":
                splits_to_try = {auto}
            else:
                splits_to_try = set(only_splits or candidate_splits(case, processors,
                                                                    config["block_n"] if config else 64)) | {auto}
            for splits in sorted(splits_to_try):
                step = flashattn_step(splits)(inputs)
                diffs[splits] = (step(0).float() - reference).abs().max().item()
                torch.cuda.synchronize(device)
                times[splits] = graph_seconds(step, copies, device) * 1e6
        results[name or "table"] = {"us": times, "max_diff": diffs}
    del inputs
    torch.cuda.empty_cache()
    return {"case": vars(case), "kernel": kernel, "auto": auto, "configs": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--cache-lens", nargs="+", type=int, default=[8192, 65536])
    parser.add_argument("--page-size", type=int, default=0, help="0: a contiguous cache")
    parser.add_argument("--configs", nargs="+", default=[],
                        help="Triton decode tile configs BLOCK_NxWARPSxSTAGES[+nostream] to sweep besides "
                             "the table's, e.g. 128x4x2")
    parser.add_argument("--splits", nargs="+", type=int, default=[],
                        help="split counts to time (besides the automatic one) instead of the candidates")
    parser.add_argument("--auto-only", action="store_true", help="time the automatic split count only")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_splits.py needs a CUDA GPU")
    device = torch.device("cuda")
    results = []
    for cache_len in args.cache_lens:
        for batch in args.batches:
            case = DecodeCase(batch=batch, cache_len=cache_len, page_size=args.page_size or None)
            result = sweep(case, device, [None, *args.configs], "auto" if args.auto_only else args.splits)
            results.append(result)
            for name, runs in result["configs"].items():
                times = runs["us"]
                best = min(times, key=times.get)
                wrong = [s for s, diff in runs["max_diff"].items() if diff > WRONG_DIFF]
                cells = " ".join(f"{s}{'*' if s == result['auto'] else ''}{'!' if s == best else ''}:{us:.1f}"
                                 for s, us in times.items())
                layout = args.page_size or "contiguous"
                print(f"| {cache_len} | {batch} | {layout} | {result['kernel']} {name} | auto {result['auto']} "
                      f"{times[result['auto']]:.1f} us | best {best} {times[best]:.1f} us | {cells} |"
                      f"{' WRONG at splits ' + str(wrong) if wrong else ''}", flush=True)
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"device": torch.cuda.get_device_name(device), "results": results}, file, indent=1)


if __name__ == "__main__":
    main()
