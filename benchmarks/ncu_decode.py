"""Nsight Compute on every kernel of one decode step, for several providers and cases, side by side (GPU).

Each case is one step of ``flashattn bench --mode decode`` (GQA 32/8, hdim 128, bf16, one query token): the
flashattn step (``flash_attn_with_kvcache`` with the fused append, optionally with a decode config of
``decode_splits.py`` and a split count) or an SDPA backend on the same contiguous cache. Three warm-up
steps run unprofiled; ncu then profiles the kernels of one step (cudaProfilerStart/Stop), caches flushed
before each as in the bench. Printed: per kernel, the rows that say why a memory-bound kernel is slow
(duration, DRAM bytes and throughput, occupancy, stalls, per-SM balance). Full CSVs under $OUT/ncu-decode.

    PYTHONPATH=src:benchmarks python3 benchmarks/ncu_decode.py \\
        --case ours:provider=flashattn,batch=64,cache=4096 \\
        --case tma4:provider=flashattn,batch=64,cache=4096,config=64x4x4+tma,splits=1 \\
        --case cudnn:provider=sdpa_cudnn,batch=64,cache=4096
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

from ncu_compare import BALANCE_METRICS, KEY_ROWS, STALL_METRICS, ncu_rows

DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
CASE_FIELDS = {"provider", "batch", "cache", "page", "config", "splits"}


def parse_case(text: str) -> tuple[str, dict]:
    name, _, spec = text.partition(":")
    fields = dict(item.split("=", 1) for item in spec.split(",") if item)
    unknown = set(fields) - CASE_FIELDS
    if unknown:
        raise SystemExit(f"--case {text!r}: unknown fields {sorted(unknown)}; expected {sorted(CASE_FIELDS)}")
    return name, fields


def run_case(fields: dict) -> None:
    """The profiled process: warm-up steps, then one step between cudaProfilerStart and Stop."""
    import torch
    from decode_splits import decode_tiles, parse_config

    from flashattn.bench_decode import DECODE_PROVIDERS, DecodeCase, flashattn_step, make_inputs

    page = int(fields["page"]) if "page" in fields else None
    case = DecodeCase(batch=int(fields.get("batch", 1)), cache_len=int(fields.get("cache", 8192)), page_size=page)
    provider = fields.get("provider", "flashattn")
    inputs = make_inputs(case, torch.device("cuda"), 1)
    config = parse_config(fields["config"]) if "config" in fields else None
    with decode_tiles(config):
        build = flashattn_step(int(fields.get("splits", 0))) if provider == "flashattn" else DECODE_PROVIDERS[provider]
        step = build(inputs)
        for _ in range(3):
            step(0)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        step(0)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def profile(name: str, case: str, logs: Path) -> list[tuple[str, dict]]:
    """[(kernel name, {metric: (value, unit)})] of the step's kernels, in launch order."""
    header, body = ncu_rows(["--profile-from-start", "off"], BALANCE_METRICS + STALL_METRICS + DRAM_METRICS,
                            [sys.executable, __file__, "--run", case], name, logs, dict(os.environ))
    ident, kernel = header.index("ID"), header.index("Kernel Name")
    metric, unit, value = header.index("Metric Name"), header.index("Metric Unit"), header.index("Metric Value")
    kernels: dict[str, tuple[str, dict]] = defaultdict(lambda: ("", {}))
    for r in body:
        kernels[r[ident]] = (r[kernel], {**kernels[r[ident]][1], r[metric]: (r[value], r[unit])})
    return [kernels[key] for key in sorted(kernels, key=int)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", default=[],
                        help="name:provider=..,batch=..,cache=..[,page=..][,config=..][,splits=..]")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        run_case(parse_case(args.run)[1])
        return
    if not args.case:
        parser.error("give at least one --case")
    logs = Path(os.environ.get("OUT", "gpu-out")) / "ncu-decode"
    logs.mkdir(parents=True, exist_ok=True)
    columns = []  # (label, metrics)
    for text in args.case:
        name = parse_case(text)[0]
        for index, (kernel, metrics) in enumerate(profile(name, text, logs)):
            columns.append((f"{name}#{index} {kernel[:28]}", metrics))
    print(f"| metric | unit | {' | '.join(label for label, _ in columns)} |\n|---|---|{'---|' * len(columns)}")
    for row in (*DRAM_METRICS, *KEY_ROWS):
        units = [metrics[row][1] for _, metrics in columns if row in metrics]
        if units:
            cells = " | ".join(metrics.get(row, ("-", ""))[0] for _, metrics in columns)
            print(f"| {row} | {units[0]} | {cells} |")


if __name__ == "__main__":
    main()
