"""The floor of a decode step: what a kernel that only reads the step's K/V bytes once takes, timed as the bench times
a step (a CUDA graph over enough cache copies to miss L2), next to flashattn's step and cuDNN's in the same process.

The decode target is 80% of the measured copy bandwidth from 8k-key caches. A step cannot read its bytes faster than a
launch that does nothing else; so where the best read-only launch falls short of 80%, no attention kernel reaches it.
The read kernel streams K and V in programs of equal contiguous chunks (16-byte loads, a float sum kept so that the
loads are not dropped), over a sweep of programs per SM, block sizes, warps and pipeline stages; the fastest
configuration of each case is its floor. "two launches" adds an empty second launch after the read, the shape of a
split step (attention, then the merge).

    PYTHONPATH=src python3 benchmarks/decode_read_floor.py --cache-lens 4096 8192 16384 --batches 1 4 16 \\
        [--json out.json]

Prints a Markdown table: microseconds per step and the share of the copy bandwidth each reaches.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl

from flashattn.tools.bench_decode import (
    DECODE_PROVIDERS,
    DecodeCase,
    choose_grid_copies,
    copy_bandwidth,
    graph_seconds,
    l2_bytes,
    make_inputs,
)


@triton.jit
def read_once_kernel(K, V, Partial, n_elements, blocks_per_program, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Program p sums elements [p x chunk, (p + 1) x chunk) of K and of V (chunk = blocks_per_program x BLOCK): whole
    blocks unmasked, then the one partial block at the end of the buffers masked."""
    program = tl.program_id(0)
    chunk = blocks_per_program * BLOCK
    start = program.to(tl.int64) * chunk
    end = tl.minimum(start + chunk, n_elements)
    whole_end = start + (tl.maximum(end - start, 0) // BLOCK) * BLOCK
    offsets = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.float32)
    for offset in tl.range(start, whole_end, BLOCK, num_stages=STAGES):
        total += tl.load(K + offset + offsets).to(tl.float32) + tl.load(V + offset + offsets).to(tl.float32)
    tail = whole_end + offsets
    in_tail = tail < end
    total += tl.load(K + tail, mask=in_tail, other=0.0).to(tl.float32)
    total += tl.load(V + tail, mask=in_tail, other=0.0).to(tl.float32)
    tl.store(Partial + program, tl.sum(total, axis=0))


@triton.jit
def empty_kernel(Partial):
    """A launch that reads one value and writes it back: the cost of a second launch in a step."""
    tl.store(Partial, tl.load(Partial))


def read_once(k: torch.Tensor, v: torch.Tensor, partial: torch.Tensor, block: int, stages: int, warps: int) -> None:
    """Read every element of k and v (same shape, contiguous) once, in ``partial.numel()`` programs."""
    n_elements = k.numel()
    blocks_per_program = triton.cdiv(triton.cdiv(n_elements, block), partial.numel())
    read_once_kernel[(partial.numel(),)](k, v, partial, n_elements, blocks_per_program, BLOCK=block, STAGES=stages,
                                         num_warps=warps)


def read_sum(k: torch.Tensor, v: torch.Tensor, programs: int = 4, block: int = 1024, stages: int = 1,
             warps: int = 4) -> float:
    """The sum of k and v as read_once computes it (a check of its chunking)."""
    partial = torch.zeros(programs, dtype=torch.float32, device=k.device)
    read_once(k, v, partial, block, stages, warps)
    return partial.sum().item()


CONFIGS = list(itertools.product((1, 2, 4), (2048, 8192), (1, 3), (4, 8)))  # programs / SM, block, stages, warps


def floor_step(inputs, config, processors: int, second_launch: bool):
    per_sm, block, stages, warps = config
    partial = torch.empty(per_sm * processors, dtype=torch.float32, device=inputs.q.device)

    def step(i: int):
        read_once(inputs.k_caches[i], inputs.v_caches[i], partial, block, stages, warps)
        if second_launch:
            empty_kernel[(1,)](partial)
        return partial

    return step


def measure_case(case: DecodeCase, device: torch.device, copy_bytes_per_s: float) -> dict:
    copies = choose_grid_copies(case.kv_bytes(), l2_bytes(device))
    inputs = make_inputs(case, device, copies)
    processors = torch.cuda.get_device_properties(device).multi_processor_count
    row = {"batch": case.batch, "cache_len": case.cache_len, "kv_bytes": case.kv_bytes()}
    floors = {}
    for config in CONFIGS:
        floors[config] = graph_seconds(floor_step(inputs, config, processors, False), copies, device)
    best = min(floors, key=floors.get)
    row["read_once_us"] = floors[best] * 1e6
    row["read_once_config"] = "x".join(map(str, best))
    row["two_launches_us"] = graph_seconds(floor_step(inputs, best, processors, True), copies, device) * 1e6
    for provider in ("flashattn", "flashattn_noappend", "sdpa_cudnn"):
        row[f"{provider}_us"] = graph_seconds(DECODE_PROVIDERS[provider](inputs), copies, device) * 1e6
    row["copy_share"] = {key[:-3]: case.kv_bytes() / (row[key] * 1e-6) / copy_bytes_per_s
                         for key in row if key.endswith("_us")}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-lens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_bytes_per_s = copy_bandwidth(device)
    print(f"# {torch.cuda.get_device_name(device)}, copy bandwidth {copy_bytes_per_s / 1e9:.0f} GB/s", flush=True)
    rows = []
    for cache_len, batch in itertools.product(args.cache_lens, args.batches):
        rows.append(measure_case(DecodeCase(batch, cache_len), device, copy_bytes_per_s))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), "copy_bytes_per_s": copy_bytes_per_s,
                       "rows": rows}, f, indent=1)
    print("\n| cache | batch | read once (best config) | two launches | flashattn | flashattn, no append | cuDNN |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        share = row["copy_share"]

        def cell(name: str, row=row, share=share) -> str:
            return f"{row[name + '_us']:.1f} us ({100 * share[name]:.0f}%)"

        print(f"| {row['cache_len'] // 1024}k | {row['batch']} | {cell('read_once')} [{row['read_once_config']}] | "
              f"{cell('two_launches')} | {cell('flashattn')} | {cell('flashattn_noappend')} | {cell('sdpa_cudnn')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
