"""Nsight Compute on one flashattn kernel in two or more cases, side by side (GPU machine).

Each case is a flash_attn_func (or, with ``varlen=1``, flash_attn_varlen_func over the same tokens packed)
call on the bench grid's shapes (16k tokens, heads * headdim = 2048, bf16); the kernel named by
``--kernel`` is profiled once per case, after two warm-up calls, with the same sections. Printed: the
metrics that say why a kernel is slow (duration, registers, occupancy, stalls, per-SM balance), then the
rows that differ most between the first two cases. Full CSVs under $OUT/ncu-compare.

    PYTHONPATH=src python3 benchmarks/ncu_compare.py --kernel dkdv_kernel \\
        --case dense:hdim=128,seqlen=4096,causal=0,mode=bwd --case causal:hdim=128,seqlen=4096,causal=1,mode=bwd

A phase's tile forced (``forward=``, ``dq=`` or ``dkdv=``, `flashattn blocks` notation), the kernel matched by a
regular expression:
    --kernel regex:dkdv --case triton:hdim=64,seqlen=2048,mode=bwd,dkdv=64x64x4x3+keyrows \\
        --case slices:hdim=64,seqlen=2048,mode=bwd,dkdv=64x128x8x3+hopper+slices

A packed (varlen) forward against the dense one on the same tokens:
    --kernel regex:attention_forward --case dense:hdim=64,seqlen=4096,causal=1 \\
        --case varlen:hdim=64,seqlen=4096,causal=1,varlen=1
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import sass_report

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis")
# per-SM busy cycles: max against average says how unevenly the grid's work landed on the SMs
BALANCE_METRICS = ("sm__cycles_active.max", "sm__cycles_active.avg", "sm__cycles_active.min")
# cycles per issued instruction that a warp spends stalled, by reason (they add up to "Warp Cycles Per
# Issued Instruction"): barrier = waiting for the CTA's other warps, long_scoreboard = global/local memory,
# wait = fixed-latency dependencies, math_pipe_throttle = the pipe (tensor cores, MUFU) is busy
STALL_METRICS = tuple(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio" for reason in (
    "barrier", "long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "mio_throttle",
    "lg_throttle", "dispatch_stall", "no_instruction", "not_selected", "selected", "membar", "branch_resolving",
    "misc", "sleeping", "drain", "imc_miss", "tex_throttle"))
KEY_ROWS = ("Duration", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Block Limit Registers",
            "Block Limit Shared Mem", "Theoretical Occupancy", "Achieved Occupancy", "Compute (SM) Throughput",
            "Issue Slots Busy", "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
            "Executed Instructions", "L2 Hit Rate", "DRAM Throughput", *BALANCE_METRICS, *STALL_METRICS)


FORCED_PHASES = ("forward", "dq", "dkdv")  # a case may force any of these phases' tiles


def parse_case(text: str) -> tuple[str, dict]:
    name, _, spec = text.partition(":")
    fields = dict(item.split("=", 1) for item in spec.split(",") if item)
    unknown = set(fields) - {"hdim", "seqlen", "causal", "window", "mode", "varlen", *FORCED_PHASES}
    if unknown:
        raise SystemExit(f"--case {text!r}: unknown fields {sorted(unknown)}; expected hdim, seqlen, causal, "
                         "window (the right window size, non-causal), mode (fwd or bwd), varlen, and forward, dq "
                         "or dkdv (that phase's tile forced, in `flashattn blocks` notation: 64x128x8x3+ws+slices)")
    return name, fields


def run_case(fields: dict) -> None:
    """The profiled process: two warm-up calls and one more, all of the case's kernels launched."""
    import torch

    from flashattn import configs
    from flashattn.tools import blocks

    head_dim, seqlen = int(fields.get("hdim", 128)), int(fields.get("seqlen", 4096))
    causal, varlen = fields.get("causal", "0") == "1", fields.get("varlen", "0") == "1"
    backward = fields.get("mode", "fwd") == "bwd"
    window = (-1, int(fields.get("window", -1)))
    batch, heads = 16384 // seqlen, 2048 // head_dim
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=backward) for _ in range(3))
    cu = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * seqlen
    with contextlib.ExitStack() as forced:
        for phase in FORCED_PHASES:
            if phase in fields:
                tile = configs.TileConfig(*blocks.parse_candidates(fields[phase])[0])
                forced.enter_context(configs.use_config(phase, tile))
        _run_calls(q, k, v, cu, seqlen, causal, window, varlen, backward)
    torch.cuda.synchronize()


def _run_calls(q, k, v, cu, seqlen, causal, window, varlen, backward) -> None:
    import torch

    from flashattn import flash_attn_func, flash_attn_varlen_func

    for _ in range(3):
        if varlen:
            out = flash_attn_varlen_func(*(x.flatten(0, 1) for x in (q, k, v)), cu, cu, seqlen, seqlen, causal=causal,
                                         window_size=window)
        else:
            out = flash_attn_func(q, k, v, causal=causal, window_size=window)
        if backward:
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))


def ncu_rows(ncu_options: list[str], metrics: tuple[str, ...], target: list[str], name: str, logs: Path,
             env: dict) -> tuple[list[str], list[list[str]]]:
    """Run ``target`` under ncu (``ncu_options``, the details page as CSV, SECTIONS and ``metrics``): the CSV's
    header and rows. The CSV and ncu's stderr are kept as ``logs``/``name``.csv and .err."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    command = [ncu, *ncu_options, "--csv", "--page", "details", "--metrics", ",".join(metrics)]
    for section in SECTIONS:
        command += ["--section", section]
    result = subprocess.run(command + target, capture_output=True, text=True, timeout=300, env=env)
    (logs / f"{name}.csv").write_text(result.stdout)
    (logs / f"{name}.err").write_text(result.stderr)
    rows = [r for r in csv.reader(result.stdout.splitlines()) if len(r) > 4]
    if not rows:
        raise SystemExit(f"{name}: no ncu metrics (see {logs / (name + '.err')})")
    return rows[0], rows[1:]


def profile(name: str, case: str, kernel: str, logs: Path, cache: Path) -> dict:
    """ncu's metrics of ``kernel`` in one case; the case compiles into its own Triton cache ``cache``."""
    header, body = ncu_rows(["--kernel-name", kernel, "--launch-skip", "2", "--launch-count", "1"],
                            BALANCE_METRICS + STALL_METRICS, [sys.executable, __file__, "--run", case], name, logs,
                            {**os.environ, "TRITON_CACHE_DIR": str(cache)})
    metric, unit, value = header.index("Metric Name"), header.index("Metric Unit"), header.index("Metric Value")
    return {r[metric]: (r[value], r[unit]) for r in body}


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", help="the Triton kernel's name (ncu --kernel-name)")
    parser.add_argument("--case", action="append", default=[], help="name:hdim=..,seqlen=..,causal=..,mode=..")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        run_case(parse_case(args.run)[1])
        return
    if not args.kernel or len(args.case) < 2:
        parser.error("give --kernel and at least two --case")
    logs = Path(os.environ.get("OUT", "gpu-out")) / "ncu-compare"
    logs.mkdir(parents=True, exist_ok=True)
    names = [parse_case(case)[0] for case in args.case]
    caches = [Path(tempfile.mkdtemp(prefix=f"ncu-compare-{name}-")) for name in names]
    results = [profile(name, case, args.kernel, logs, cache)
               for name, case, cache in zip(names, args.case, caches, strict=True)]
    print(f"| metric | unit | {' | '.join(names)} |\n|---|---|{'---|' * len(names)}")
    for row in KEY_ROWS:
        if row in results[0]:
            print(f"| {row} | {results[0][row][1]} | {' | '.join(r.get(row, ('-', ''))[0] for r in results)} |")
    first, second = results[0], results[1]
    differing = []
    for row in first.keys() & second.keys():
        a, b = number(first[row][0]), number(second[row][0])
        if row not in KEY_ROWS and a is not None and b is not None and max(abs(a), abs(b)) > 0:
            differing.append((abs(a - b) / max(abs(a), abs(b)), row))
    print(f"\nMost different between {names[0]} and {names[1]}:")
    for _, row in sorted(differing, reverse=True)[:20]:
        print(f"| {row} | {first[row][1]} | {' | '.join(r.get(row, ('-', ''))[0] for r in results)} |")
    print(f"\n{args.kernel} as the launcher compiled it (sass_report.py):")
    for name, cache in zip(names, caches, strict=True):
        print(f"{name}:", flush=True)
        for kernel in _kernel_names(args.kernel, cache):
            sass_report.report_cache(cache, kernel)


def _kernel_names(kernel: str, cache: Path) -> list[str]:
    """The kernels ``--kernel`` names in a Triton cache: itself, or (``regex:PATTERN``, ncu's form) every compiled
    kernel whose name matches."""
    if not kernel.startswith("regex:"):
        return [kernel]
    pattern = re.compile(kernel.removeprefix("regex:"))
    return sorted({path.stem for path in cache.rglob("*.cubin") if pattern.search(path.stem)})


if __name__ == "__main__":
    main()
