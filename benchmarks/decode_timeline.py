"""Probe (GPU, sm90): where a Gluon decode step's time goes, from global-timer stamps that each program of the
kernel writes (``decode_ops.GLUON_DECODE_TIMES``; slots: 0 kernel entry, 1 Q in shared memory, 2 the first cache block
in, 3 the whole blocks done, 4 the output stored, 5 the loader's last copy issued). Steps with the append run back to
back in a CUDA graph over cache copies that miss L2, as the bench times them; each step stamps its own buffer.

    PYTHONPATH=src python3 benchmarks/decode_timeline.py --cases 4096x16 4096x32 8192x1 [--page-size 256]

Prints per case the medians over the graph's steps (microseconds): the step period, the spread of the programs'
entries, entry to Q, Q to the first block, the stream (first block to whole blocks done), the last blocks and
epilogue, the spread of the programs' ends, and the gap from the last program's end to the next step's first entry
(for split steps the merge kernel runs in it).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from flashattn import decode_ops, launcher
from flashattn.bench_decode import DecodeCase, choose_grid_copies, flashattn_step, l2_bytes, make_inputs

STEPS = 16


def timeline(case: DecodeCase, device: torch.device) -> dict:
    copies = choose_grid_copies(case.kv_bytes(), l2_bytes(device))
    inputs = make_inputs(case, device, copies)
    step = flashattn_step(0)(inputs)
    programs = 132 * 64  # more than any launch here
    stamps = torch.zeros(STEPS, programs, 8, dtype=torch.int64, device=device)
    launcher.clear_plans()
    decode_ops.GLUON_DECODE_TIMES = stamps[0]
    step(0)  # compile
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(STEPS):
            decode_ops.GLUON_DECODE_TIMES = stamps[i]
            step(i % copies)
    decode_ops.GLUON_DECODE_TIMES = None
    launcher.clear_plans()
    for _ in range(3):
        stamps.zero_()
        graph.replay()
    torch.cuda.synchronize(device)
    rows = []
    used = int((stamps[0, :, 0] != 0).sum())
    t = stamps[:, :used].double() / 1e3  # microseconds
    for i in range(STEPS - 1):
        s, nxt = t[i], t[i + 1]
        rows.append({
            "period": (nxt[:, 0].min() - s[:, 0].min()).item(),
            "entry spread": (s[:, 0].max() - s[:, 0].min()).item(),
            "entry to Q": (s[:, 1] - s[:, 0]).median().item(),
            "Q to block": (s[:, 2] - s[:, 1]).median().item(),
            "stream": (s[:, 3] - s[:, 2]).median().item(),
            "tail+epilogue": (s[:, 4] - s[:, 3]).median().item(),
            "loader done to end": (s[:, 4] - s[:, 5]).median().item(),
            "end spread": (s[:, 4].max() - s[:, 4].min()).item(),
            "gap to next": (nxt[:, 0].min() - s[:, 4].max()).item(),
        })
    del inputs, stamps, graph
    torch.cuda.empty_cache()
    return {"programs": used, **{key: statistics.median(r[key] for r in rows) for key in rows[0]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["4096x16", "4096x32", "8192x1"], help="CACHExBATCH")
    parser.add_argument("--page-size", type=int, default=0)
    args = parser.parse_args()
    device = torch.device("cuda")
    header = None
    for spec in args.cases:
        cache_len, batch = (int(part) for part in spec.split("x"))
        result = timeline(DecodeCase(batch=batch, cache_len=cache_len, page_size=args.page_size or None), device)
        if header is None:
            header = list(result)
            print("| case | " + " | ".join(header) + " |")
            print("|---" * (len(header) + 1) + "|")
        print(f"| {spec} | " + " | ".join(f"{result[k]:.2f}" if isinstance(result[k], float) else str(result[k])
                                         for k in header) + " |", flush=True)


if __name__ == "__main__":
    main()
