"""Draw the H200 tile sweeps, with the IO model's reading of each candidate, for docs/block-size.md.

Reads ``benchmarks/results/h200-blocks.json``: the full forward and backward sweeps of
``benchmarks/sweep_blocks.py`` (seqlen 4096, batch 4, heads * head dim = 2048, bf16) and the forward
TMA sweeps of ``flashattn blocks --json`` (hdim 128, seqlen 16384). Every candidate is labelled with
what ``flashattn.tools.blocks`` estimates for it: shared memory per program and the fp32 tile registers per
thread (a lower bound). ``--markdown`` prints the same as tables, with the model's derivation for an
A100 (not measured: no A100 here).

    PYTHONPATH=src python benchmarks/plot_block_sweeps.py                 # writes docs/figures/block-size-h200.png
    PYTHONPATH=src python benchmarks/plot_block_sweeps.py --markdown      # the tables of docs/block-size.md
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from flashattn.tools.blocks import HOPPER_SMEM_PER_BLOCK, MAX_REGISTERS_PER_THREAD, Shape, estimate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "h200-blocks.json"
DEFAULT_PNG = ROOT / "docs" / "figures" / "block-size-h200.png"
SWEEP_SEQLEN = 4096  # sweep_blocks.py's default, which these sweeps used
HOPPER_SMS = 132

# Per SM: shared memory (KB, of which each resident program reserves 1 KB more), warps, SMs,
# bandwidth (TB/s) and dense bf16 matmul peak (TFLOP/s). H200 and H100: measured ceilings
# (flashattn.tools.iomodel.GPU_PRESETS); A100: datasheet (40 GB / 80 GB bandwidth), for the derivation only.
GPUS = {
    "H200": dict(smem_kb=228, block_smem_kb=227, sms=132, bandwidth=(4.23,), peak=788),
    "H100": dict(smem_kb=228, block_smem_kb=227, sms=132, bandwidth=(3.02,), peak=789),
    "A100": dict(smem_kb=164, block_smem_kb=163, sms=108, bandwidth=(1.55, 2.04), peak=312),
}
MAX_WARPS_PER_SM = 64


@dataclass(frozen=True)
class Point:
    """One timed (or failed) candidate with the model's estimates for its sweep's shape."""

    phase: str  # forward, dkdv, dq (a backward candidate is timed as the whole backward)
    head_dim: int
    causal: bool
    seqlen: int
    config: str
    candidate: tuple
    tflops: float | None
    status: str
    smem_bytes: int
    accumulator_regs: int
    reread_factor: float
    programs: int


def _point(phase, head_dim, causal, seqlen, batch, heads, candidate, label, tflops, status) -> Point:
    shape = Shape(batch=batch, seqlen=seqlen, heads=heads, head_dim=head_dim, dtype="bf16", causal=causal)
    model = estimate(phase, candidate, shape, HOPPER_SMS)
    return Point(phase, head_dim, causal, seqlen, label, candidate, tflops, status, model.smem_bytes,
                 model.accumulator_regs, model.reread_factor, model.programs)


def load(results: Path = RESULTS) -> list[Point]:
    """The points of a sweeps file: ``sweeps`` (forward, backward: sweep_blocks.py's rows) and ``tma_sweeps``
    (``flashattn blocks --json`` outputs)."""
    data = json.loads(Path(results).read_text())
    points = []
    for phase in ("forward", "backward"):
        for row in data["sweeps"][phase]:
            candidate = tuple(row["config"])
            points.append(_point(row["phase"], row["head_dim"], row["causal"], SWEEP_SEQLEN,
                                 max(1, 16384 // SWEEP_SEQLEN), 2048 // row["head_dim"], candidate,
                                 "x".join(map(str, candidate)), row["tflops"], row["status"]))
    for sweep in data["tma_sweeps"]:
        shape = sweep["shape"]
        for row in sweep["results"]:
            flags = row["config"].split("+")[1:]
            candidate = (row["block_m"], row["block_n"], row["num_warps"], row["num_stages"], "tma" in flags)
            points.append(_point(row["phase"], shape["head_dim"], shape["causal"], shape["seqlen"], shape["batch"],
                                 shape["heads"], candidate, row["config"], row["tflops"], row["status"]))
    return points


def resident_programs(point: Point, gpu: str) -> int:
    """Programs an SM can hold by shared memory and warps (registers may allow fewer): 0 if none fits."""
    spec = GPUS[gpu]
    if point.smem_bytes > spec["block_smem_kb"] * 1024:
        return 0
    by_smem = spec["smem_kb"] * 1024 // (point.smem_bytes + 1024)
    return min(by_smem, MAX_WARPS_PER_SM // point.candidate[2])


def no_reuse_bound_tflops(point: Point, gpu: str, bandwidth: float) -> float:
    """The forward's roofline with K/V re-read from HBM per query block: 2 * BLOCK_M / 2 bytes FLOP/B."""
    intensity = 2 * point.candidate[0] / 2
    return min(GPUS[gpu]["peak"], intensity * bandwidth)


# ---------------------------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------------------------


def _panel(axes, points: list[Point], title: str) -> None:
    import numpy as np

    configs = list(dict.fromkeys(p.config for p in points))
    x = np.arange(len(configs))
    width = 0.4
    for offset, causal, color in ((-width / 2, False, "tab:blue"), (width / 2, True, "tab:orange")):
        mine = {p.config: p for p in points if p.causal == causal}
        if not mine:
            continue
        heights = [(mine[c].tflops or 0.0) if c in mine else 0.0 for c in configs]
        axes.bar(x + offset, heights, width, color=color, label="causal" if causal else "non-causal")
        timed = [mine[c] for c in configs if c in mine and mine[c].tflops]
        best = max(timed, key=lambda p: p.tflops) if timed else None
        for i, config in enumerate(configs):
            point = mine.get(config)
            if point is None:
                continue
            if point is best:
                axes.plot(i + offset, point.tflops + 18, marker="*", color="black", markersize=9)
            if not point.tflops:
                status = {"OutOfResources": "out of shared memory"}.get(point.status, point.status)
                axes.text(i + offset, 12, status, rotation=90, ha="center", va="bottom", fontsize=7, color="red")
    labels = []
    for config in configs:
        point = next(p for p in points if p.config == config)
        smem = f"{point.smem_bytes // 1024}K" + ("!" if point.smem_bytes > HOPPER_SMEM_PER_BLOCK else "")
        regs = f"{point.accumulator_regs}r" + ("!" if point.accumulator_regs > MAX_REGISTERS_PER_THREAD else "")
        labels.append(f"{config}\n{smem} {regs}")
    axes.set_xticks(x, labels, rotation=90, fontsize=7)
    axes.set_title(title, fontsize=9)
    axes.set_ylim(0, 600)
    axes.grid(axis="y", alpha=0.3)


def plot(points: list[Point], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 4, figsize=(19, 10), layout="constrained")
    sweep = [p for p in points if p.seqlen == SWEEP_SEQLEN]
    for column, head_dim in enumerate((64, 128, 256)):
        _panel(axes[0, column], [p for p in sweep if p.phase == "forward" and p.head_dim == head_dim],
               f"forward, hdim {head_dim}, seqlen 4k")
        _panel(axes[1, column], [p for p in sweep if p.phase == "dkdv" and p.head_dim == head_dim],
               f"dK/dV candidates, hdim {head_dim}, 4k (whole backward)")
    _panel(axes[0, 3], [p for p in points if p.seqlen == 16384], "forward, hdim 128, seqlen 16k: TMA (+tma)\n"
                                                                  "and warp specialization (+ws)")
    _panel(axes[1, 3], [p for p in sweep if p.phase == "dq" and p.head_dim == 256],
           "dQ candidates, hdim 256, 4k (whole backward)")
    for row in axes:
        row[0].set_ylabel("TFLOP/s (H200, bf16)")
    axes[0, 0].legend(loc="lower left", fontsize=8)
    figure.suptitle("flashattn tile sweeps on the H200: bf16, 16k tokens, heads x hdim = 2048.  Labels: "
                    "BLOCK_M x BLOCK_N x warps x stages; shared memory per program and fp32 tile registers per "
                    "thread (lower bound); '!' over the 227 KB / 255 limit; * the best", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# ---------------------------------------------------------------------------------------------
# The tables
# ---------------------------------------------------------------------------------------------


def _tflops(point: Point | None) -> str:
    if point is None:
        return "-"
    return f"{point.tflops:.0f}" if point.tflops else point.status


def markdown(points: list[Point]) -> str:
    out = []
    sweep = [p for p in points if p.seqlen == SWEEP_SEQLEN]
    for phase in ("forward", "dkdv", "dq"):
        for head_dim in (64, 128, 256):
            mine = [p for p in sweep if p.phase == phase and p.head_dim == head_dim]
            out.append(f"\n**{phase}, hdim {head_dim}** (seqlen 4096, batch 4, {2048 // head_dim} heads)\n")
            out.append("| BMxBNxWxS | smem / program | fp32 tile regs / thread | re-reads | programs / SM (H200) "
                       "| waves (H200) | TFLOP/s non-causal | causal |")
            out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
            for config in dict.fromkeys(p.config for p in mine):
                pair = {p.causal: p for p in mine if p.config == config}
                point = pair.get(False) or pair[True]
                resident = resident_programs(point, "H200")
                waves = f"{point.programs / (HOPPER_SMS * resident):.1f}" if resident else "-"
                out.append(f"| {config} | {point.smem_bytes // 1024} KB | {point.accumulator_regs} | "
                           f"{point.reread_factor:.0f}x | {resident} | {waves} | {_tflops(pair.get(False))} | "
                           f"{_tflops(pair.get(True))} |")
    tma = [p for p in points if p.seqlen == 16384]
    out.append("\n**forward, hdim 128, seqlen 16384** (batch 1, 16 heads; TMA sweep)\n")
    out.append("| config | smem / program | fp32 tile regs / thread | re-reads | TFLOP/s non-causal | causal |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for config in dict.fromkeys(p.config for p in tma):
        pair = {p.causal: p for p in tma if p.config == config}
        point = pair.get(False) or pair[True]
        out.append(f"| {config} | {point.smem_bytes // 1024} KB | {point.accumulator_regs} | "
                   f"{point.reread_factor:.0f}x | {_tflops(pair.get(False))} | {_tflops(pair.get(True))} |")
    out.append("\n**A100, derived from the model (not measured)**: the forward candidates at seqlen 4096\n")
    out.append("| hdim | BMxBNxWxS | smem / program | fits 163 KB | programs / SM | waves (108 SMs) | "
               "no-reuse bound, 1.55 / 2.04 TB/s | H200 measured, non-causal |")
    out.append("|---:|---|---:|:-:|---:|---:|---:|---:|")
    for point in (p for p in sweep if p.phase == "forward" and not p.causal):
        resident = resident_programs(point, "A100")
        waves = f"{point.programs / (GPUS['A100']['sms'] * resident):.1f}" if resident else "-"
        bounds = " / ".join(f"{no_reuse_bound_tflops(point, 'A100', b):.0f}" for b in GPUS["A100"]["bandwidth"])
        out.append(f"| {point.head_dim} | {point.config} | {point.smem_bytes // 1024} KB | "
                   f"{'yes' if resident else 'no'} | {resident} | {waves} | {bounds} | {_tflops(point)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"the sweeps file (default {RESULTS.name})")
    parser.add_argument("--out", type=Path, default=DEFAULT_PNG, help=f"PNG to write (default {DEFAULT_PNG})")
    parser.add_argument("--markdown", action="store_true", help="print the tables instead of drawing")
    args = parser.parse_args(argv)
    points = load(args.results)
    if args.markdown:
        print(markdown(points))
    else:
        print(f"wrote {plot(points, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
