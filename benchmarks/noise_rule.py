"""Which cells of the dense grid meet a speed target by the noise rule, from several runs of the dense benchmark.

The rule: a ratio meets a target when it reaches ``--tolerance`` (0.98) of it in two runs of three (in general in
two thirds of the runs, rounded up), since two runs of the same kernels differ by about 2%. Each run is a dense
results file as ``flashattn bench`` writes it (``<machine>-dense.json``), or several joined by commas where one run
was split over calls (their cells merged). Per direction, head dim, mask and length the ratio is flashattn's TFLOP/s
over the best of the other providers in that run (``--against``: of those named), and the cell is

- ``met``: at the target (default 1.0) by the rule;
- ``floor``: not met, but at the floor (default 0.95) by the rule;
- ``below``: under the floor;
- ``short``: in too few of the runs to say.

    python benchmarks/noise_rule.py run1/h200-dense.json run2/h200-dense.json run3a.json,run3b.json
    python benchmarks/noise_rule.py ... --against fa4 --directions bwd
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import report

DIRECTIONS = {"fwd": "fwd_tflops", "bwd": "bwd_tflops"}
OURS = "flashattn"


def load_run(spec: str) -> dict[tuple, dict[str, dict]]:
    """One run's cells, (head dim, causal, seqlen) -> provider -> row, from one results file or several joined by
    commas (a later file's rows replace an earlier one's for the same cell and provider)."""
    cells: dict[tuple, dict[str, dict]] = {}
    for name in spec.split(","):
        path = Path(name)
        try:
            rows = json.loads(path.read_text())["results"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"run '{spec}': {path} is not a readable dense results file ({error})") from error
        for cell, providers in report.dense_cells(rows).items():
            cells.setdefault(cell, {}).update(providers)
    return cells


def ratio(providers: dict[str, dict], key: str, against: tuple[str, ...] | None) -> float | None:
    """flashattn's figure over the best other provider's (of ``against``, when given), None where either is missing."""
    ours = providers.get(OURS, {}).get(key)
    others = [row.get(key) for name, row in providers.items()
              if name != OURS and (against is None or name in against)]
    others = [value for value in others if value]
    if not ours or not others:
        return None
    return ours / max(others)


def runs_needed(runs: int) -> int:
    """Two runs of three, and two thirds rounded up for other counts."""
    return max(1, math.ceil(2 * runs / 3))


def classify(values: list[float | None], target: float, floor: float, tolerance: float) -> str:
    """``met``, ``floor``, ``below`` or ``short`` for one cell's ratios, one a run (None: not in that run)."""
    needed = runs_needed(len(values))
    present = [value for value in values if value is not None]
    if len(present) < needed:
        return "short"
    if sum(value >= tolerance * target for value in present) >= needed:
        return "met"
    if sum(value >= tolerance * floor for value in present) >= needed:
        return "floor"
    return "below"


def cell_ratios(runs: list[dict], key: str, against: tuple[str, ...] | None) -> dict[tuple, list[float | None]]:
    """(head dim, causal, seqlen) -> one ratio a run, over the cells any run has."""
    cells = sorted({cell for run in runs for cell in run})
    return {cell: [ratio(run[cell], key, against) if cell in run else None for run in runs] for cell in cells}


def fmt_values(values: list[float | None]) -> str:
    return " / ".join("-" if value is None else f"{value:.3f}" for value in values)


def direction_table(ratios: dict[tuple, list[float | None]], target: float, floor: float,
                    tolerance: float) -> list[str]:
    """A markdown table: a row a (head dim, mask), a column a length, each cell its runs' ratios and its class."""
    seqlens = sorted({seqlen for _, _, seqlen in ratios})
    rows = sorted({(head_dim, causal) for head_dim, causal, _ in ratios})

    def cell(values: list[float | None] | None) -> str:
        return "" if values is None else f"{fmt_values(values)} {classify(values, target, floor, tolerance)}"

    lines = report.table(["hdim", "causal"] + [str(s) for s in seqlens], [
        [str(head_dim), "yes" if causal else "no"] + [cell(ratios.get((head_dim, causal, s))) for s in seqlens]
        for head_dim, causal in rows], numeric_from=2)
    counts = {name: 0 for name in ("met", "floor", "below", "short")}
    for values in ratios.values():
        counts[classify(values, target, floor, tolerance)] += 1
    return lines + ["", ", ".join(f"{name}: {count}" for name, count in counts.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="a dense results file a run (files of one run joined by commas)")
    parser.add_argument("--target", type=float, default=1.0)
    parser.add_argument("--floor", type=float, default=0.95)
    parser.add_argument("--tolerance", type=float, default=0.98, help="the share of a target that counts as met")
    parser.add_argument("--against", nargs="+", help="the providers to compare with (default: every other one)")
    parser.add_argument("--directions", nargs="+", choices=tuple(DIRECTIONS), default=list(DIRECTIONS))
    args = parser.parse_args(argv)
    try:
        runs = [load_run(spec) for spec in args.runs]
    except ValueError as error:
        parser.error(str(error))
    against = tuple(args.against) if args.against else None
    print(f"{len(runs)} runs; a cell meets a figure at {args.tolerance} of it in {runs_needed(len(runs))} of them; "
          f"target {args.target}, floor {args.floor}; flashattn over the best of "
          f"{', '.join(against) if against else 'the other providers'}")
    for direction in args.directions:
        print(f"\n{direction}\n")
        ratios = cell_ratios(runs, DIRECTIONS[direction], against)
        print("\n".join(direction_table(ratios, args.target, args.floor, args.tolerance)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
