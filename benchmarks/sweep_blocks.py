"""Time flashattn's kernels over candidate tile configs on the local GPU, for the tile table's grid of cases.

A thin loop over ``flashattn blocks`` (``src/flashattn/tools/blocks.py`` holds the candidates, the check
against SDPA and the timing): every head dim, causal and not, at the shapes the table was measured on
(16k tokens, heads * head dim = 2048). Winners go into ``src/flashattn/configs.py`` by hand, after the
GPU test suite passes with them. For one shape, with the IO model's columns, use ``flashattn blocks``. The sweeps
that docs/block-size.md draws are kept in ``benchmarks/results/h200-blocks.json`` (``plot_block_sweeps.py``).

    PYTHONPATH=src python3 benchmarks/sweep_blocks.py --phase forward --head-dims 64 128
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import torch

from flashattn.tools.blocks import KERNEL_PHASES, Shape, candidates_for, sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=KERNEL_PHASES, nargs="+", default=list(KERNEL_PHASES))
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--json", default=None, help="write all timings to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sweep_blocks.py: timings need a CUDA GPU (flashattn blocks --interpret-check validates "
                         "configs without one)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for head_dim in args.head_dims:
        for causal in (False, True):
            shape = Shape(batch=max(1, 16384 // args.seqlen), seqlen=args.seqlen, heads=2048 // head_dim,
                          head_dim=head_dim, dtype="bf16", causal=causal)

            def progress(row, head_dim=head_dim, causal=causal) -> None:
                timing = "" if row.tflops is None else f"{row.tflops:6.1f} TFLOP/s"
                print(f"{row.phase:8} d{head_dim:<4} causal={int(causal)} {row.config} {timing} {row.status}",
                      flush=True)

            candidates = {phase: candidates_for(phase, head_dim) for phase in args.phase}
            for row in sweep(shape, candidates, device=torch.device("cuda"), timed=True, sms=sms, progress=progress):
                rows.append(dict(head_dim=head_dim, causal=causal, **asdict(row)))
    print("\nbest:")
    for phase in args.phase:
        for row in rows:
            if row["phase"] == phase and row["best"]:
                print(f"{phase:8} d{row['head_dim']:<4} causal={int(row['causal'])} {row['config']} "
                      f"{row['tflops']:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
