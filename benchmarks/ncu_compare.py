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

Against FlashAttention-4's sm90 kernel (``provider=fa4``, flash-attn-4 importable; ``kernel=`` names the case's own
kernel, a regular expression over ncu's kernel names):
    --kernel regex:attention_forward_hopper --case ours:hdim=128,seqlen=16384 \\
        --case fa4:hdim=128,seqlen=16384,provider=fa4,kernel=regex:FlashAttentionForwardSm90

and against cuDNN's (``provider=cudnn``: torch SDPA on its cuDNN backend; its kernels are named ``..._flash_fprop_...``
and ``..._flash_bprop_...``):
    --case cudnn:hdim=64,seqlen=1024,causal=1,provider=cudnn,kernel=regex:flash_fprop

The FP8 forward (``dtype=fp8``: e4m3 q, k, v from ``fp8.quantize`` with per-head descales, a dense forward):
    --kernel regex:attention_forward_fp8_hopper --case fp8:hdim=128,seqlen=16384,dtype=fp8

Besides the metrics: per opcode, the instructions each case's kernel executed and its share of the stall samples
(ncu's source page), which says where two kernels doing the same work spend different instructions.
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
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "SourceCounters")
# per-SM busy cycles: max against average says how unevenly the grid's work landed on the SMs
BALANCE_METRICS = ("sm__cycles_active.max", "sm__cycles_active.avg", "sm__cycles_active.min")
# cycles per issued instruction that a warp spends stalled, by reason (they add up to "Warp Cycles Per
# Issued Instruction"): barrier = waiting for the CTA's other warps, long_scoreboard = global/local memory,
# wait = fixed-latency dependencies, math_pipe_throttle = the pipe (tensor cores, MUFU) is busy
STALL_METRICS = tuple(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio" for reason in (
    "barrier", "long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "mio_throttle",
    "lg_throttle", "dispatch_stall", "no_instruction", "not_selected", "selected", "membar", "branch_resolving",
    "misc", "sleeping", "drain", "imc_miss", "tex_throttle"))
# L2 traffic by kind: all sectors, those of TMA loads, and those that crossed between the two L2 halves (a line read
# through the far half counts in both)
L2_METRICS = ("lts__t_sectors.sum", "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_ltcfabric.sum",
              "lts__t_requests.sum")
KEY_ROWS = ("Duration", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Block Limit Registers",
            "Block Limit Shared Mem", "Theoretical Occupancy", "Achieved Occupancy", "Compute (SM) Throughput",
            "Issue Slots Busy", "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
            "Executed Instructions", "L2 Hit Rate", "L2 Cache Throughput", "DRAM Throughput", *L2_METRICS,
            *BALANCE_METRICS, *STALL_METRICS)


FORCED_PHASES = ("forward", "dq", "dkdv")  # a case may force any of these phases' tiles


def parse_case(text: str) -> tuple[str, dict]:
    name, _, spec = text.partition(":")
    fields = dict(item.split("=", 1) for item in spec.split(",") if item)
    unknown = set(fields) - {"hdim", "seqlen", "causal", "window", "mode", "varlen", "provider", "kernel", "dtype",
                             *FORCED_PHASES}
    if unknown:
        raise SystemExit(f"--case {text!r}: unknown fields {sorted(unknown)}; expected hdim, seqlen, causal, "
                         "window (the right window size, non-causal), mode (fwd or bwd), varlen, provider (flashattn, "
                         "fa4 or cudnn), kernel (this case's kernel name), dtype (bf16 or fp8), and forward, dq or "
                         "dkdv (that phase's tile forced, in `flashattn blocks` notation: 64x128x8x3+ws+slices)")
    if fields.get("provider", "flashattn") not in ("flashattn", "fa4", "cudnn"):
        raise SystemExit(f"--case {text!r}: provider must be flashattn, fa4 or cudnn")
    if fields.get("provider", "flashattn") != "flashattn" and {"varlen", "window", *FORCED_PHASES} & set(fields):
        raise SystemExit(f"--case {text!r}: an fa4 or cudnn case is a dense call with or without the causal mask: no "
                         "varlen, window or forced tile")
    if fields.get("dtype", "bf16") not in ("bf16", "fp8"):
        raise SystemExit(f"--case {text!r}: dtype must be bf16 or fp8")
    if fields.get("dtype") == "fp8" and (fields.get("mode", "fwd") != "fwd"
                                         or fields.get("provider", "flashattn") != "flashattn"
                                         or {"varlen", "window", *FORCED_PHASES} & set(fields)):
        raise SystemExit(f"--case {text!r}: an fp8 case is flashattn's dense forward with or without the causal "
                         "mask: no bwd, fa4 or cudnn, varlen, window or forced tile")
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
        if fields.get("dtype") == "fp8":
            _run_fp8_calls(q, k, v, causal)
        else:
            _run_calls(q, k, v, cu, seqlen, causal, window, varlen, backward, fields.get("provider", "flashattn"))
    torch.cuda.synchronize()


def _run_fp8_calls(q, k, v, causal) -> None:
    from flashattn import flash_attn_func, fp8

    quantized = fp8.quantize(q, k, v, granularity="head")
    for _ in range(3):
        flash_attn_func(*quantized[:3], causal=causal, q_descale=quantized.q_descale, k_descale=quantized.k_descale,
                        v_descale=quantized.v_descale)


def _run_calls(q, k, v, cu, seqlen, causal, window, varlen, backward, provider) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from flashattn import flash_attn_func, flash_attn_varlen_func

    for _ in range(3):
        if provider == "fa4":
            from flash_attn.cute import flash_attn_func as fa4_attention

            out = fa4_attention(q, k, v, causal=causal)[0]  # (out, lse)
        elif provider == "cudnn":
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):  # (batch, heads, seqlen, head dim) views
                out = scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                                   is_causal=causal).transpose(1, 2)
        elif varlen:
            out = flash_attn_varlen_func(*(x.flatten(0, 1) for x in (q, k, v)), cu, cu, seqlen, seqlen, causal=causal,
                                         window_size=window)
        else:
            out = flash_attn_func(q, k, v, causal=causal, window_size=window)
        if backward:
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))


def ncu_report(ncu_options: list[str], metrics: tuple[str, ...], target: list[str], name: str, logs: Path,
               env: dict) -> tuple[list[str], list[list[str]], str]:
    """Run ``target`` under ncu (``ncu_options``, SECTIONS and ``metrics``) into the report ``logs``/``name``; then its
    details page as CSV (header and rows) and its source page (SASS, CSV). Both CSVs and ncu's stderr are kept
    beside the report."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    report = logs / name
    command = [ncu, *ncu_options, "--metrics", ",".join(metrics), "-f", "-o", str(report)]
    for section in SECTIONS:
        command += ["--section", section]
    result = subprocess.run(command + target, capture_output=True, text=True, timeout=300, env=env)
    (logs / f"{name}.err").write_text(result.stderr)
    pages = {}
    for page, extra in (("details", []), ("source", ["--print-source", "sass"])):
        shown = subprocess.run([ncu, "--import", f"{report}.ncu-rep", "--csv", "--page", page, *extra],
                               capture_output=True, text=True, timeout=300)
        (logs / f"{name}.{page}.csv").write_text(shown.stdout)
        pages[page] = shown.stdout
    rows = [r for r in csv.reader(pages["details"].splitlines()) if len(r) > 4]
    if not rows:
        raise SystemExit(f"{name}: no ncu metrics (see {logs / (name + '.err')})")
    return rows[0], rows[1:], pages["source"]


def _source_rows(source_csv: str) -> list[dict]:
    """The instruction rows of ncu's source page of one kernel (``--page source --csv --print-source sass``), each
    a dict by column name; none where the page has no instruction table."""
    lines = source_csv.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    return [] if start is None else list(csv.DictReader(lines[start:]))


def opcode_profile(source_csv: str) -> dict[str, tuple[float, float]]:
    """From ncu's source page of one kernel: per opcode (the mnemonic's first part, predicates dropped), the warp
    instructions executed and the share of the warp stall samples on them."""
    executed, samples = {}, {}
    for row in _source_rows(source_csv):
        words = [w for w in row.get("Source", "").split() if not w.startswith("@")]
        if not words:
            continue
        opcode = words[0].split(".")[0]
        executed[opcode] = executed.get(opcode, 0.0) + (number(row.get("Instructions Executed", "")) or 0.0)
        samples[opcode] = samples.get(opcode, 0.0) + (number(row.get("Warp Stall Sampling (All Samples)", "")) or 0.0)
    total = sum(samples.values()) or 1.0
    return {op: (executed[op], samples[op] / total) for op in executed}


def profile(name: str, case: str, kernel: str, logs: Path, cache: Path) -> tuple[dict, str]:
    """ncu's metrics of ``kernel`` in one case, and its source page (SASS, CSV); the case compiles into its own
    Triton cache ``cache``."""
    options = ["--kernel-name", kernel, "--launch-skip", "2", "--launch-count", "1"]
    target, env = [sys.executable, __file__, "--run", case], {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    try:
        header, body, source = ncu_report(options, L2_METRICS + BALANCE_METRICS + STALL_METRICS, target, name, logs,
                                          env)
    except SystemExit:  # an ncu that lacks one of the L2 metrics refuses them all
        header, body, source = ncu_report(options, BALANCE_METRICS + STALL_METRICS, target, name, logs, env)
    metric, unit, value = header.index("Metric Name"), header.index("Metric Unit"), header.index("Metric Value")
    return {r[metric]: (r[value], r[unit]) for r in body}, source


def stall_hotspots(source_csv: str, rows: int = 15) -> list[tuple[str, str, float, str]]:
    """From ncu's source page of one kernel: the ``rows`` instructions with the most warp stall samples, each as
    (offset, SASS, share of all samples, its two largest stall reasons with their shares of its samples). Offsets
    are from the kernel's first instruction, as ``sass_report.disassemble`` lists the cubin."""
    records = _source_rows(source_csv)
    total = sum(number(r.get("Warp Stall Sampling (All Samples)", "")) or 0.0 for r in records) or 1.0
    base = min((int(r["Address"], 16) for r in records if r.get("Address")), default=0)
    hot = []
    for row in records:
        samples = number(row.get("Warp Stall Sampling (All Samples)", "")) or 0.0
        reasons = sorted(((number(value) or 0.0, key.removeprefix("stall_")) for key, value in row.items()
                          if key and key.startswith("stall_") and "Not Issued" not in key), reverse=True)
        named = ", ".join(f"{reason} {count / samples:.0%}" for count, reason in reasons[:2] if count and samples)
        offset = f"{int(row['Address'], 16) - base:#06x}" if row.get("Address") else ""
        hot.append((samples, offset, " ".join(row.get("Source", "").split()), named))
    hot.sort(reverse=True)
    return [(offset, source, samples / total, named) for samples, offset, source, named in hot[:rows]]


def opcode_table(names: list[str], opcodes: list[dict], rows: int = 16) -> str:
    """The ``opcode_profile`` of each case side by side: millions of instructions executed and the stall share,
    for the opcodes most executed in any case."""
    ranked = sorted({op for o in opcodes for op in o}, key=lambda op: -max(o.get(op, (0.0, 0.0))[0] for o in opcodes))
    lines = [f"| opcode | {' | '.join(f'{n}: M executed, stalls' for n in names)} |", "|---|" + "---|" * len(names)]
    for op in ranked[:rows]:
        cells = (f"{o[op][0] / 1e6:.1f}, {o[op][1]:.1%}" if op in o else "-" for o in opcodes)
        lines.append(f"| {op} | {' | '.join(cells)} |")
    totals = (f"{sum(e for e, _ in o.values()) / 1e6:.1f}" for o in opcodes)
    lines.append(f"| all | {' | '.join(totals)} |")
    return "\n".join(lines)


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
    parsed = [parse_case(case) for case in args.case]
    if len(args.case) < 2 or not all(args.kernel or fields.get("kernel") for _, fields in parsed):
        parser.error("give at least two --case, and --kernel or each case's kernel=")
    logs = Path(os.environ.get("OUT", "gpu-out")) / "ncu-compare"
    logs.mkdir(parents=True, exist_ok=True)
    names = [name for name, _ in parsed]
    kernels = [fields.get("kernel", args.kernel) for _, fields in parsed]
    caches = [Path(tempfile.mkdtemp(prefix=f"ncu-compare-{name}-")) for name in names]
    profiles = [profile(name, case, kernel, logs, cache)
                for name, case, kernel, cache in zip(names, args.case, kernels, caches, strict=True)]
    results = [metrics for metrics, _ in profiles]
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
    print(f"\nInstructions by opcode:\n{opcode_table(names, [opcode_profile(page) for _, page in profiles])}")
    for name, (_, page) in zip(names, profiles, strict=True):
        print(f"\nWhere {name}'s warps stall (the instructions with the most samples):")
        for offset, source, share, reasons in stall_hotspots(page):
            print(f"| {offset} | {source[:60]} | {share:.1%} | {reasons} |")
    print("\nThe kernels as the launcher compiled them (sass_report.py; flashattn's cases):")
    for name, kernel, cache in zip(names, kernels, caches, strict=True):
        print(f"{name}:", flush=True)
        for compiled in _kernel_names(kernel, cache):
            sass_report.report_cache(cache, compiled)


def _kernel_names(kernel: str, cache: Path) -> list[str]:
    """The kernels ``--kernel`` names in a Triton cache: itself, or (``regex:PATTERN``, ncu's form) every compiled
    kernel whose name matches."""
    if not kernel.startswith("regex:"):
        return [kernel]
    pattern = re.compile(kernel.removeprefix("regex:"))
    return sorted({path.stem for path in cache.rglob("*.cubin") if pattern.search(path.stem)})


if __name__ == "__main__":
    main()
