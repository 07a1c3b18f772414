"""Benchmark results files: one per machine kind and mode in the folder a run is given (``flashattn bench --out``,
the current directory unless given), replaced by the mode's next run there. The maintained runs keep theirs in
``RESULTS_FOLDER``, from which ``benchmarks/report.py`` builds BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

RESULTS_FOLDER = Path("benchmarks/results")  # the maintained runs' folder, relative to the repository root
VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "instinct", "radeon"}


def machine_kind(env: dict) -> str:
    """The machine part of a results file's name: the GPU's model in lower case, up to its first word with a digit
    ("NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA GeForce RTX 4090" -> "rtx4090"); "cpu" when
    the run had no GPU (``environment`` records a capability for GPUs only)."""
    if not env.get("capability"):
        return "cpu"
    kind = ""
    for word in re.split(r"[\s_-]+", env.get("device") or ""):
        if not word or word.lower() in VENDOR_WORDS:
            continue
        kind += re.sub(r"[^a-z0-9]", "", word.lower())
        if any(c.isdigit() for c in word):
            break
    return kind or "gpu"


def write_results(folder: Path, env: dict, mode: str, rows: list[dict], machine: str | None = None) -> Path:
    """``folder``/<machine>-<mode>.json: the environment and the rows, replacing the file (written whole, then
    renamed, so that a reader never sees half of it). ``machine``: default ``machine_kind(env)``; runs over several
    devices name their count (``h200x2``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{machine or machine_kind(env)}-{mode}.json"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"environment": env, "results": rows}, indent=1) + "\n")
    os.replace(partial, path)
    return path
