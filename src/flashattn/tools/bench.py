"""Attention providers side by side, in one run, on the local device (``flashattn bench``).

Providers are a registry of builders: each takes (q, k, v, causal) in flash-attn layout
(batch, seqlen, heads, headdim) and returns a zero-argument callable that runs the forward. The
backward is timed as ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``, the
convention of every FlashAttention benchmark. FLOPs: 4 * B * H * Sq * Sk * D forward, halved when
causal; backward = 2.5 x forward.

Times come from ``timing.time_call``, as the demo's do: repeated until settled, with their spread (on the CPU the
interquartile range of the runs over their median; a time that never settled is marked). Peak memory: the forward's
peak allocation above what was allocated before it, its output included, from the CUDA allocator's counters on a
GPU and from torch.profiler's allocation events on the CPU (``demo.allocation_window``).

A run writes ``<machine>-<mode>.json`` (``h200-dense.json``, ``cpu-dense.json``; modes ``dense``, ``varlen``,
``decode``, and ``fp8`` and ``fp8_train`` with ``--dtype fp8``) into ``--out``, the current directory unless given,
replacing the previous run of that mode on that kind of machine there: the device, versions, commit and date, then
one row per provider and case. The maintained runs write into ``benchmarks/results`` (``--out
benchmarks/results``), from which ``python benchmarks/report.py`` builds BENCHMARKS.md. The table is printed; a
provider that is missing or fails on a case is reported, not fatal.

``--varlen`` adds two packed providers on the same tokens (batch * seqlen): ``flashattn_varlen``
(the batch packed, equal lengths: the cost of the varlen path against the dense one, same FLOPs) and
``flashattn_varlen_mixed`` (the tokens re-cut into sequences of random lengths averaging seqlen; its
TFLOP/s count the FLOPs of those lengths, and its output is not compared).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import __version__, flops, fp8
from ..interface import flash_attn_func
from ..validation import MAX_HEAD_DIM
from ..varlen import flash_attn_varlen_func
from .clocks import ClockMonitor
from .demo import allocation_window, standard_attention
from .results import RESULTS_FOLDER, machine_kind, write_results  # noqa: F401  (machine_kind: the bench's API)
from .timing import Timing, time_call
from .units import EXIT_USAGE, positive_int

Runner = Callable[[], torch.Tensor]


@dataclass(frozen=True)
class BenchCase:
    batch: int
    seqlen: int
    nheads: int
    head_dim: int
    causal: bool
    dtype: str = "bfloat16"
    nheads_k: int | None = None

    def forward_flops(self) -> float:
        return float(flops.forward_flops(self.batch, self.seqlen, self.seqlen, self.nheads, self.head_dim, self.causal))

    def step_flops(self) -> float:
        """A training step's: the forward's and the backward's (``flops.py``)."""
        return self.forward_flops() + flops.backward_flops(self.batch, self.seqlen, self.seqlen, self.nheads,
                                                           self.head_dim, self.causal)


@dataclass
class Measurement:
    provider: str
    case: BenchCase
    fwd_ms: float | None = None
    bwd_ms: float | None = None
    # the runs' spread around the median (timing.Timing.spread) and whether they settled
    fwd_spread: float | None = None
    bwd_spread: float | None = None
    fwd_settled: bool | None = None
    bwd_settled: bool | None = None
    fwd_tflops: float | None = None
    bwd_tflops: float | None = None
    peak_extra_mib: float | None = None
    max_diff_vs_flashattn: float | None = None
    fwd_host_us: float | None = None
    bwd_host_us: float | None = None
    # the median SM clock and the highest board power sampled while the timing ran (clocks.ClockMonitor)
    fwd_sm_mhz: float | None = None
    bwd_sm_mhz: float | None = None
    fwd_power_w: float | None = None
    bwd_power_w: float | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


def _sdpa(backend_name: str):
    def build(q, k, v, causal: bool) -> Runner:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # torch's layout: (B, H, S, D)
        gqa = qh.shape[1] != kh.shape[1]

        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, enable_gqa=gqa).transpose(1, 2)

        return run

    return build


def _flashattn(q, k, v, causal: bool) -> Runner:
    return lambda: flash_attn_func(q, k, v, causal=causal)


def fa4_available() -> bool:
    """Whether FlashAttention-4 (flash-attn-4: CuTe-DSL kernels, with sm90 ones) is importable, as the ``fa4``
    provider needs; the GPU benchmark's default providers take it then."""
    try:
        from flash_attn.cute import flash_attn_func  # noqa: F401
    except ImportError:
        return False
    return True


def _fa4(q, k, v, causal: bool) -> Runner:
    from flash_attn.cute import flash_attn_func as fa4_attention

    return lambda: fa4_attention(q, k, v, causal=causal)[0]  # (out, lse)


def mixed_lengths(total: int, mean: int, seed: int = 0) -> list[int]:
    """Sequence lengths drawn uniformly from [1, 2 * mean - 1] until they add up to ``total``."""
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(int(torch.randint(1, max(2, 2 * mean), (1,), generator=generator)))
    lengths[-1] -= sum(lengths) - total
    return lengths


def _flashattn_varlen(mixed: bool):
    def build(q, k, v, causal: bool) -> Runner:
        batch, seqlen, nheads, head_dim = q.shape
        lengths = mixed_lengths(batch * seqlen, seqlen) if mixed else [seqlen] * batch
        cu_seqlens = torch.tensor([0, *lengths], device=q.device).cumsum(0).to(torch.int32)
        packed = [x.flatten(0, 1) for x in (q, k, v)]  # views: the backward reaches q, k and v
        longest = max(lengths)

        def run():
            out = flash_attn_varlen_func(*packed, cu_seqlens, cu_seqlens, longest, longest, causal=causal)
            return out.view(q.shape)

        run.forward_flops = float(sum(flops.forward_flops(1, n, n, nheads, head_dim, causal) for n in lengths))
        run.comparable = not mixed  # mixed lengths compute another function than the dense providers
        return run

    return build


_FLEX_CACHE: dict = {}


def _flex(q, k, v, causal: bool) -> Runner:
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    if "fn" not in _FLEX_CACHE:
        _FLEX_CACHE["fn"] = torch.compile(flex_attention, dynamic=False)
    compiled = _FLEX_CACHE["fn"]
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    block_mask = None
    if causal:
        block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, qh.shape[2], kh.shape[2],
                                       device=q.device)
    gqa = qh.shape[1] != kh.shape[1]
    return lambda: compiled(qh, kh, vh, block_mask=block_mask, enable_gqa=gqa).transpose(1, 2)


PROVIDERS: dict[str, Callable] = {
    "flashattn": _flashattn,
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "sdpa_efficient": _sdpa("EFFICIENT_ATTENTION"),
    "sdpa_math": _sdpa("MATH"),
    "flex": _flex,
    "fa4": _fa4,
    "naive": standard_attention,
    "flashattn_varlen": _flashattn_varlen(mixed=False),
    "flashattn_varlen_mixed": _flashattn_varlen(mixed=True),
}
CPU_PROVIDERS = ("flashattn", "sdpa_math", "naive")
VARLEN_PROVIDERS = ("flashattn_varlen", "flashattn_varlen_mixed")


def _time_ms(fn: Callable[[], object], device: torch.device) -> float:
    return time_call(fn, device).seconds * 1e3


HOST_TIMING_MAX_MS = 2.0
"""GPU cases that time under this many milliseconds also get their host time per call (``host_microseconds``).
Short cells can move by 15-60% between full grids of the same kernels while SDPA's do not: a host time near the GPU
time says the call was host-bound on that machine."""
HOST_TIMING_CALLS = 20


def host_microseconds(fn: Callable[[], object], device: torch.device, calls: int = HOST_TIMING_CALLS) -> float:
    """Host microseconds per call of ``fn``, ``calls`` calls issued back to back after one warm-up call. On a GPU the
    host does not wait for the kernels, so this is the time to issue a call; when it reaches the GPU time per call,
    the GPU waits for the host."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return elapsed / calls * 1e6


def measure(provider: str, case: BenchCase, device: torch.device, modes: tuple[str, ...],
            reference_out: torch.Tensor | None, clocks: ClockMonitor | None = None,
            builder: Callable | None = None) -> tuple[Measurement, torch.Tensor | None]:
    """One provider on one case: its forward and backward times (``modes``), peak memory and largest difference
    from ``reference_out``; ``builder`` in place of the registry's (``PROVIDERS[provider]``)."""
    result = Measurement(provider, case)
    dtype = getattr(torch, case.dtype)
    nheads_k = case.nheads_k or case.nheads
    generator = torch.Generator(device=device).manual_seed(0)
    shape_q = (case.batch, case.seqlen, case.nheads, case.head_dim)
    shape_k = (case.batch, case.seqlen, nheads_k, case.head_dim)
    try:
        q = torch.randn(shape_q, device=device, dtype=dtype, generator=generator, requires_grad=True)
        k = torch.randn(shape_k, device=device, dtype=dtype, generator=generator, requires_grad=True)
        v = torch.randn(shape_k, device=device, dtype=dtype, generator=generator, requires_grad=True)
        fn = (builder or PROVIDERS[provider])(q, k, v, case.causal)
        kept: dict[str, torch.Tensor] = {}

        def forward() -> None:
            kept["out"] = fn()

        with torch.no_grad():
            result.peak_extra_mib = allocation_window(forward, device).peak / 2**20
        out = kept.pop("out")
        if not getattr(fn, "comparable", True):
            result.extra["not_compared"] = "computes another function"
        elif reference_out is None:
            result.extra["not_compared"] = "no flashattn output" if provider != "flashattn" else "the reference"
        else:
            result.max_diff_vs_flashattn = (out.float() - reference_out.float()).abs().max().item()
        fwd_flops = getattr(fn, "forward_flops", None) or case.forward_flops()
        if "fwd" in modes:
            started = time.monotonic()
            with torch.no_grad():
                timing = time_call(fn, device)
            result.fwd_ms, result.fwd_spread, result.fwd_settled = _timing_fields(timing)
            if clocks is not None:
                result.fwd_sm_mhz, result.fwd_power_w = clocks.window(started, time.monotonic())
            result.fwd_tflops = fwd_flops / result.fwd_ms / 1e9
            if device.type == "cuda" and result.fwd_ms < HOST_TIMING_MAX_MS:
                with torch.no_grad():
                    result.fwd_host_us = host_microseconds(fn, device)
        if "bwd" in modes:
            out_grad = fn()
            dout = torch.randn_like(out_grad)
            def backward():
                return torch.autograd.grad(out_grad, (q, k, v), dout, retain_graph=True)

            started = time.monotonic()
            result.bwd_ms, result.bwd_spread, result.bwd_settled = _timing_fields(time_call(backward, device))
            if clocks is not None:
                result.bwd_sm_mhz, result.bwd_power_w = clocks.window(started, time.monotonic())
            result.bwd_tflops = flops.backward_of(fwd_flops) / result.bwd_ms / 1e9
            if device.type == "cuda" and result.bwd_ms < HOST_TIMING_MAX_MS:
                result.bwd_host_us = host_microseconds(backward, device)
        return result, out.detach()
    except Exception as exc:  # a provider that cannot run a case is reported, not fatal
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        return result, None
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _timing_fields(timing: Timing) -> tuple[float, float, bool]:
    """A Timing as the results file keeps it: milliseconds, spread, settled."""
    return timing.seconds * 1e3, timing.spread, timing.settled


def anchor_grid(head_dims=(64, 128, 256), seqlens=(512, 1024, 2048, 4096, 8192, 16384),
                causal=(False, True), tokens: int = 16384, hidden: int = 2048, dtype: str = "bfloat16"):
    """The ANCHORS grid: batch * seqlen = 16k tokens, heads * headdim = 2048."""
    return [BenchCase(max(1, tokens // n), n, hidden // d, d, c, dtype)
            for d in head_dims for c in causal for n in seqlens]


def _git_commit() -> str | None:
    """git's HEAD, with "-dirty" when tracked files differ from it: a copy of a working tree may carry an older .git
    (:func:`environment` takes FLASHATTN_COMMIT first)."""
    try:
        result = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude", "*"],
                                capture_output=True, text=True, check=False, cwd=Path(__file__).parent)
    except OSError:
        return None
    return result.stdout.strip() or None


def environment() -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flashattn": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["commit"] = os.environ.get("FLASHATTN_COMMIT") or _git_commit()  # the env var: trees without .git
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, sms=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
    else:
        info["device"] = platform.processor() or "cpu"
    return info


MATMUL_SIZES = {"cuda": 8192, "cpu": 1024}


def measured_matmul_tflops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float:
    """The dense matmul ceiling of this device, measured on random square matrices: 8192^3 in bf16 on a GPU,
    1024^3 in the run's dtype on the CPU (where bf16 may have no fast path)."""
    n = MATMUL_SIZES[device.type]
    if device.type == "cuda":
        dtype = torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = _time_ms(lambda: a @ b, device)
    return 2 * n**3 / ms / 1e9


def markdown_table(measurements: list[Measurement], providers: list[str]) -> str:
    """One table per (head dim, causal): fwd / bwd TFLOP/s per provider, and flashattn's ratios."""
    lines = []
    groups = sorted({(m.case.head_dim, m.case.causal) for m in measurements})
    for head_dim, causal in groups:
        lines.append(f"\n**hdim {head_dim}, {'causal' if causal else 'non-causal'}** — fwd / bwd TFLOP/s\n")
        ratio_cols = [p for p in ("sdpa_flash", "sdpa_cudnn") if p in providers]
        header = ["seqlen", *providers, *(f"flashattn / {p}" for p in ratio_cols)]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        rows = sorted({m.case.seqlen for m in measurements if (m.case.head_dim, m.case.causal) == (head_dim, causal)})
        for seqlen in rows:
            cell = {m.provider: m for m in measurements
                    if (m.case.head_dim, m.case.causal, m.case.seqlen) == (head_dim, causal, seqlen)}

            def fmt(m: Measurement | None) -> str:
                if m is None or m.error:
                    return "–"
                return " / ".join("–" if x is None else (f"{x:.0f}" if x >= 10 else f"{x:.2g}")
                                  for x in (m.fwd_tflops, m.bwd_tflops))

            def ratio(a: float | None, b: float | None) -> str:
                return "–" if not a or not b else f"{a / b:.2f}"

            ours = cell.get("flashattn")
            ratios = []
            for p in ratio_cols:
                other = cell.get(p)
                if ours is None or other is None or other.error or ours.error:
                    ratios.append("–")
                else:
                    fwd, bwd = ratio(ours.fwd_tflops, other.fwd_tflops), ratio(ours.bwd_tflops, other.bwd_tflops)
                    ratios.append(f"{fwd} / {bwd}")
            lines.append("| " + " | ".join([str(seqlen), *(fmt(cell.get(p)) for p in providers), *ratios]) + " |")
    return "\n".join(lines) + "\n"


# fixed colours, so that a provider keeps its colour from one figure to the next
PROVIDER_COLORS = {"flashattn": "C0", "sdpa_flash": "C1", "sdpa_cudnn": "C2", "flex": "C3", "fa4": "C4",
                   "sdpa_efficient": "C5", "sdpa_math": "C6", "naive": "C7"}


def plot_results(results_path: Path, png_path: Path) -> Path:
    """TFLOP/s against seqlen from a results JSON: a column per (head dim, causal), the forward above the backward, a
    line per provider (flashattn first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(results_path).read_text())
    rows = [r for r in data["results"] if not r.get("error")]
    panels = sorted({(r["case"]["head_dim"], r["case"]["causal"]) for r in rows})
    directions = [d for d in ("fwd", "bwd") if any(r.get(f"{d}_tflops") for r in rows)]
    providers = sorted(dict.fromkeys(r["provider"] for r in rows), key=lambda p: p != "flashattn")
    seqlens = sorted({r["case"]["seqlen"] for r in rows})
    figure, axes = plt.subplots(len(directions), len(panels), figsize=(3.2 * len(panels), 3.0 * len(directions)),
                                squeeze=False, sharey=True)
    for column, (head_dim, causal) in enumerate(panels):
        for row, direction in enumerate(directions):
            ax = axes[row][column]
            for provider in providers:
                points = sorted((r["case"]["seqlen"], r[f"{direction}_tflops"]) for r in rows
                                if r["provider"] == provider and r.get(f"{direction}_tflops")
                                and (r["case"]["head_dim"], r["case"]["causal"]) == (head_dim, causal))
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=provider,
                            color=PROVIDER_COLORS.get(provider, f"C{8 + providers.index(provider) % 2}"),
                            linewidth=2.2 if provider == "flashattn" else 1.2)
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens, [f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in seqlens],
                          fontsize=7)
            ax.minorticks_off()
            ax.set_title(f"hdim {head_dim}, {'causal' if causal else 'non-causal'}, {direction}", fontsize=9)
            ax.grid(alpha=0.3)
            if column == 0:
                ax.set_ylabel("TFLOP/s")
            if row == len(directions) - 1:
                ax.set_xlabel("seqlen")
    env = data.get("environment") or {}
    axes[0][0].legend(fontsize=7)
    figure.suptitle(f"{env.get('device')}, {str(env.get('date', ''))[:10]}, torch {env.get('torch')}, "
                    f"triton {env.get('triton')}, commit {env.get('commit')}", fontsize=10)
    figure.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=110, metadata={"Software": None})  # no version stamp: the same data, the same file
    plt.close(figure)
    return png_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("attention", "decode"), default="attention",
                        help="attention (default): the training grid below; decode: one new token over a KV "
                             "cache, see flashattn.bench_decode (--batches, --cache-lens, --page-sizes)")
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="decode mode: batch sizes")
    parser.add_argument("--cache-lens", nargs="+", type=int, default=None, help="decode mode: cache lengths")
    parser.add_argument("--page-sizes", nargs="+", type=int, default=None,
                        help="decode mode: page sizes of the paged cases (a contiguous case always runs)")
    parser.add_argument("--providers", nargs="+", default=None, choices=list(PROVIDERS),
                        help="default: flashattn, cuDNN and FA4 (where installed) on a GPU; flashattn, sdpa_math and "
                        "naive on the CPU")
    parser.add_argument("--head-dims", nargs="+", type=head_dim, default=None,
                        help=f"between 1 and {MAX_HEAD_DIM} (default: 64 128 256 on a GPU, 64 on the CPU)")
    parser.add_argument("--seqlens", nargs="+", type=positive_int, default=None)
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32", "fp8"), default=None,
                        help="fp8: the FP8 forward beside the bf16 ones, the quantizer and the FP8 matmul ceiling")
    parser.add_argument("--training", action="store_true",
                        help="with --dtype fp8: training steps (forward + backward, quantization included) of "
                             "fp8.flash_attn_func beside the bf16 providers' (<machine>-fp8_train.json)")
    parser.add_argument("--tokens", type=positive_int, default=16384, help="batch * seqlen (default 16384)")
    parser.add_argument("--hidden", type=positive_int, default=2048, help="heads * headdim (default 2048)")
    parser.add_argument("--gqa", type=positive_int, default=1, help="query heads per kv head (default 1)")
    parser.add_argument("--modes", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"])
    parser.add_argument("--varlen", action="store_true",
                        help="add the packed providers flashattn_varlen and flashattn_varlen_mixed")
    parser.add_argument("--out", type=Path, default=Path("."),
                        help="folder of the results file <machine>-<mode>.json, which a run replaces (default: "
                             f"the current directory; the maintained runs pass {RESULTS_FOLDER})")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table to this file")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads for the run (default: torch's; fewer is steadier on a busy machine)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="also draw TFLOP/s against seqlen to this PNG (needs matplotlib)")


def head_dim(text: str) -> int:
    """An argparse type: a head dim flashattn takes, so that one it refuses is a usage error before any run."""
    value = positive_int(text)
    if value > MAX_HEAD_DIM:
        raise argparse.ArgumentTypeError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {value}")
    return value


def format_rate(tflops: float | None) -> str:
    """TFLOP/s with three significant digits below 100 (a CPU's 0.0412 is not 0.0)."""
    if tflops is None:
        return "n/a"
    return f"{tflops:.0f}" if tflops >= 100 else f"{tflops:.3g}"


def _timed(direction: str, ms: float | None, spread: float | None, settled: bool | None,
           tflops: float | None) -> str:
    if ms is None:
        return f"{direction} not run"
    timing = Timing(ms / 1e3, spread or 0.0, 0, settled is not False)
    return f"{direction} {timing.describe()} {format_rate(tflops)} TFLOP/s"


def _progress_line(m: Measurement) -> str:
    """One measurement as the run prints it: times with their spread and rates, memory, the check against
    flashattn, host time and SM clock where taken."""
    if m.error:
        return m.error
    host = f"  host {m.fwd_host_us or 0:.0f} / {m.bwd_host_us or 0:.0f} us" if m.fwd_host_us or m.bwd_host_us else ""
    clock = f"  clock {m.fwd_sm_mhz or 0:.0f} / {m.bwd_sm_mhz or 0:.0f} MHz" if m.fwd_sm_mhz or m.bwd_sm_mhz else ""
    memory = "n/a" if m.peak_extra_mib is None else f"{m.peak_extra_mib:.3g} MiB"
    if m.max_diff_vs_flashattn is not None:
        diff = f"{m.max_diff_vs_flashattn:.2e}"
    else:
        diff = f"n/a ({m.extra.get('not_compared', 'not compared')})"
    return (f"{_timed('fwd', m.fwd_ms, m.fwd_spread, m.fwd_settled, m.fwd_tflops)}  "
            f"{_timed('bwd', m.bwd_ms, m.bwd_spread, m.bwd_settled, m.bwd_tflops)}  "
            f"peak mem {memory}  diff {diff}{host}{clock}")


def check_grid(grid: list[BenchCase], hidden: int, gqa: int) -> str | None:
    """Why the grid cannot run (a usage error), or None."""
    for case in grid:
        if case.nheads < 1:
            return f"argument --hidden: {hidden} is smaller than head dim {case.head_dim}: no head fits"
        if case.nheads % gqa:
            return f"argument --gqa: {gqa} must divide the {case.nheads} query heads of head dim {case.head_dim}"
    return None


def run(args: argparse.Namespace) -> int:
    """``flashattn bench``: the run, with torch's CPU threads set for it (and restored) when --threads is given."""
    threads = torch.get_num_threads()
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "mode", "attention") == "decode":
        from . import bench_decode

        return bench_decode.run(args, environment())
    if args.dtype == "fp8":
        return run_fp8(args, environment())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    # on a GPU the anchors (the results files' providers; the slow references, PyTorch's eager softmax at 16k among
    # them, would take the grid past one GPU call): the others on request
    providers = args.providers or (_baseline(on_gpu=True) if on_gpu else list(CPU_PROVIDERS))
    if args.varlen:
        providers = providers + [p for p in VARLEN_PROVIDERS if p not in providers]
    if "flashattn" in providers:  # first, so the others are checked against it
        providers = ["flashattn"] + [p for p in providers if p != "flashattn"]
    causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    if on_gpu:
        grid = anchor_grid(tuple(args.head_dims or (64, 128, 256)),
                           tuple(args.seqlens or (512, 1024, 2048, 4096, 8192, 16384)), causal,
                           args.tokens, args.hidden, args.dtype or "bfloat16")
    else:  # a small CPU grid instead of failing
        grid = anchor_grid(tuple(args.head_dims or (64,)), tuple(args.seqlens or (256, 512, 1024)), causal,
                           tokens=min(args.tokens, 1024), hidden=min(args.hidden, 256),
                           dtype=args.dtype or "float32")
    problem = check_grid(grid, args.hidden if on_gpu else min(args.hidden, 256), args.gqa)
    if problem:
        print(f"flashattn bench: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.gqa > 1:
        grid = [BenchCase(c.batch, c.seqlen, c.nheads, c.head_dim, c.causal, c.dtype, c.nheads // args.gqa)
                for c in grid]
    env = environment()
    env["matmul_tflops"] = measured_matmul_tflops(device, getattr(torch, grid[0].dtype))
    matmul = f"{MATMUL_SIZES[device.type]}^3 {grid[0].dtype if device.type == 'cpu' else 'bfloat16'}"
    print(f"# {env.get('device')}  torch {env['torch']}  triton {env['triton']}  commit {env['commit']}"
          f"  matmul ({matmul}) {format_rate(env['matmul_tflops'])} TFLOP/s"
          f"  threads {torch.get_num_threads()}", flush=True)
    measurements: list[Measurement] = []
    modes = tuple(args.modes)
    mode = "varlen" if any(p in VARLEN_PROVIDERS for p in providers) else "dense"
    with ClockMonitor(device) as clocks:
        for case in grid:
            reference_out = None
            for provider in providers:
                if provider == "naive" and case.batch * case.nheads * case.seqlen**2 * 2 > 8 * 2**30:
                    measurements.append(Measurement(provider, case, error="skipped: N^2 scores over 8 GiB"))
                    continue
                m, out = measure(provider, case, device, modes, reference_out, clocks)
                if provider == "flashattn":
                    reference_out = out
                measurements.append(m)
                print(f"d{case.head_dim:<4} causal={int(case.causal)} n={case.seqlen:<6} {provider:<15} "
                      f"{_progress_line(m)}", flush=True)
            # rewritten after every case, so that a run cut short by a time limit keeps what it measured
            write_results(args.out, env, mode, [asdict(m) for m in measurements])
    path = write_results(args.out, env, mode, [asdict(m) for m in measurements])
    table = markdown_table(measurements, providers)
    print(table)
    print(f"results: {path.resolve()}")
    if args.markdown:
        args.markdown.write_text(table)
    if args.plot:
        plot_results(path, args.plot)
        print(f"plot: {args.plot}")
    return 0


# ---------------------------------------------------------------------------------------------
# --dtype fp8
# ---------------------------------------------------------------------------------------------

# ``flashattn bench --dtype fp8``: FP8 attention beside the bf16 providers, in one run.
#
# Forward (the default). Each case times, forward only, on the same bf16 inputs: flashattn's bf16 forward and torch's
# SDPA backends (on a GPU), then the FP8 kernel on inputs quantized beforehand, with block descales
# (``flashattn_fp8``) and per-head ones (``flashattn_fp8_head``). The quantizer (``fp8.quantize``: Hadamard rotation
# of q and k, block scales, the e4m3 casts) is timed on its own, as ``quantize`` (ms only: it does no attention FLOPs).
# The header gives two ceilings measured on random 8192^3 matrices: bf16 ``a @ b`` and FP8 ``torch._scaled_mm`` (e4m3
# in, bf16 out). Writes ``<machine>-fp8.json``.
#
# Training (``--training``). Each case times a training step's two halves, as ``flashattn bench`` times every
# provider (the backward as ``torch.autograd.grad(..., retain_graph=True)``): flashattn's bf16 ``flash_attn_func``,
# SDPA's cuDNN backend and FlashAttention-4 where installed (on a GPU), and ``fp8.flash_attn_func`` on the same bf16
# inputs as ``flashattn_fp8``, whose forward quantizes q, k and v (the rotation, block descales) and whose backward
# quantizes dO, runs the FP8 backward and rotates dQ and dK back. The step is the sum; its TFLOP/s count the forward's
# FLOPs 3.5 times. Writes ``<machine>-fp8_train.json``.
#
# Either prints its table; a provider that is missing or fails on a case is reported, not fatal.

FP8_PROVIDERS = ("flashattn_fp8", "flashattn_fp8_head", "quantize")
CEILING_SIZE = 8192


def scaled_mm_tflops(device: torch.device, n: int = CEILING_SIZE) -> float | None:
    """The FP8 matmul ceiling: ``torch._scaled_mm`` on e4m3 n x n matrices (the second column-major), bf16 out."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt's FP8 GEMM needs
    one = torch.tensor(1.0, device=device)
    seconds = time_call(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                        device).seconds
    return 2 * n**3 / seconds / 1e12


def _fp8_builders(q, k, v, causal: bool) -> dict:
    block = fp8.quantize(q, k, v)
    head = fp8.quantize(q, k, v, granularity="head")

    def attend(quantized):
        descales = dict(q_descale=quantized.q_descale, k_descale=quantized.k_descale, v_descale=quantized.v_descale)
        return lambda: flash_attn_func(*quantized[:3], causal=causal, **descales)

    return {"flashattn_fp8": attend(block), "flashattn_fp8_head": attend(head),
            "quantize": lambda: fp8.quantize(q, k, v)}


def measure_fp8_case(case: BenchCase, device: torch.device, providers: list[str]) -> list[Measurement]:
    generator = torch.Generator(device=device).manual_seed(0)
    nheads_k = case.nheads_k or case.nheads
    q = torch.randn(case.batch, case.seqlen, case.nheads, case.head_dim, device=device, dtype=torch.bfloat16,
                    generator=generator)
    k, v = (torch.randn(case.batch, case.seqlen, nheads_k, case.head_dim, device=device, dtype=torch.bfloat16,
                        generator=generator) for _ in range(2))
    fp8_runners = _fp8_builders(q, k, v, case.causal)
    rows = []
    for provider in providers:
        m = Measurement(provider, case)
        try:
            run = fp8_runners[provider] if provider in fp8_runners else PROVIDERS[provider](q, k, v, case.causal)
            timing = time_call(run, device)
            m.fwd_ms, m.fwd_spread, m.fwd_settled = timing.seconds * 1e3, timing.spread, timing.settled
            if provider != "quantize":
                m.fwd_tflops = case.forward_flops() / timing.seconds / 1e12
            if device.type == "cuda" and m.fwd_ms < HOST_TIMING_MAX_MS:  # host-bound short cells show here
                m.fwd_host_us = host_microseconds(run, device)
        except Exception as error:  # a provider missing or failing on a case is reported, not fatal
            m.error = f"{type(error).__name__}: {error}"[:200]
        rows.append(m)
    return rows


def fp8_table(measurements: list[Measurement], providers: list[str]) -> str:
    lines = ["| hdim | causal | seqlen | " + " | ".join(providers) + " |", "|---|---|---|" + "---|" * len(providers)]
    cases = list(dict.fromkeys(m.case for m in measurements))
    for case in cases:
        cells = []
        for provider in providers:
            m = next((m for m in measurements if m.case == case and m.provider == provider), None)
            if m is None or m.fwd_ms is None:
                cells.append("-")
            elif provider == "quantize":
                cells.append(f"{m.fwd_ms:.3f} ms")
            else:
                cells.append(f"{format_rate(m.fwd_tflops)} TF/s")
        lines.append(f"| {case.head_dim} | {int(case.causal)} | {case.seqlen} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _baseline(on_gpu: bool) -> list[str]:
    """The anchors: flashattn's call, cuDNN's and FlashAttention-4's where it is installed (the dense grid's providers
    by default, and the bf16 calls FP8 is to beat)."""
    return ["flashattn", "sdpa_cudnn", *(["fa4"] if fa4_available() else [])] if on_gpu else ["flashattn"]


def _grid(args: argparse.Namespace, on_gpu: bool, default_head_dims: tuple[int, ...]) -> list[BenchCase]:
    """The cases: the anchors' grid on a GPU, a small one on the CPU (the PyTorch paths: checks the run, measures
    nothing of interest); ``--gqa`` query heads a kv head."""
    causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    if on_gpu:
        grid = anchor_grid(tuple(args.head_dims or default_head_dims), tuple(args.seqlens or (1024, 4096, 16384)),
                           causal, args.tokens, args.hidden)
    else:
        grid = anchor_grid(tuple(args.head_dims or (64,)), tuple(args.seqlens or (256,)), causal,
                           tokens=min(args.tokens, 512), hidden=min(args.hidden, 128))
    if args.gqa > 1:
        grid = [BenchCase(c.batch, c.seqlen, c.nheads, c.head_dim, c.causal, c.dtype, c.nheads // args.gqa)
                for c in grid]
    return grid


def _run_grid(args: argparse.Namespace, env: dict, mode: str, grid: list[BenchCase],
              measure_case: Callable[[BenchCase], list[Measurement]],
              table: Callable[[list[Measurement]], str]) -> int:
    """Each case measured and its row printed, the results file rewritten after each (a run cut short keeps the cases
    it finished); then the table, the failures, and the file once more."""
    measurements: list[Measurement] = []
    for case in grid:
        measurements += measure_case(case)
        print(table(measurements).splitlines()[-1], flush=True)
        write_results(args.out, env, mode, [asdict(m) for m in measurements])
    print(table(measurements))
    for m in measurements:
        if m.error:
            print(f"{m.provider} d{m.case.head_dim} n{m.case.seqlen} causal={int(m.case.causal)}: {m.error}")
    path = write_results(args.out, env, mode, [asdict(m) for m in measurements])
    print(f"results: {path.resolve()}")
    return 0


def run_fp8_forward(args: argparse.Namespace, env: dict) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    providers = (args.providers or _baseline(on_gpu)) + list(FP8_PROVIDERS)
    grid = _grid(args, on_gpu, default_head_dims=(64, 128, 256))
    env["matmul_tflops"] = measured_matmul_tflops(device)
    env["fp8_matmul_tflops"] = scaled_mm_tflops(device)
    print(f"# {env.get('device')}  torch {env['torch']}  triton {env['triton']}  commit {env['commit']}  "
          f"bf16 matmul {format_rate(env['matmul_tflops'])} TFLOP/s  fp8 _scaled_mm ({CEILING_SIZE}^3) "
          f"{format_rate(env['fp8_matmul_tflops'])} TFLOP/s", flush=True)
    return _run_grid(args, env, "fp8", grid, lambda case: measure_fp8_case(case, device, providers),
                     lambda measurements: fp8_table(measurements, providers))


# ---------------------------------------------------------------------------------------------
# --training
# ---------------------------------------------------------------------------------------------

TRAIN_PROVIDER = "flashattn_fp8"  # fp8.flash_attn_func: quantized inside, FP8 forward and backward


def _fp8_training(q, k, v, causal: bool):
    def run():
        return fp8.flash_attn_func(q, k, v, causal=causal)

    return run


def step_ms(m: Measurement) -> float | None:
    """A training step's milliseconds: its forward's and its backward's."""
    return None if m.fwd_ms is None or m.bwd_ms is None else m.fwd_ms + m.bwd_ms


def measure_training_case(case: BenchCase, device: torch.device, providers: list[str]) -> list[Measurement]:
    """One row a provider, forward and backward timed, the FP8 output compared with flashattn's bf16 one."""
    rows, reference_out = [], None
    for provider in providers:
        builder = _fp8_training if provider == TRAIN_PROVIDER else None
        m, out = measure(provider, case, device, ("fwd", "bwd"), reference_out, builder=builder)
        if provider == "flashattn":
            reference_out = out
        rows.append(m)
    return rows


def training_table(measurements: list[Measurement], providers: list[str]) -> str:
    """Step milliseconds a provider, the FP8 step's TFLOP/s, and the other steps' times over the FP8 one."""
    others = [p for p in providers if p != TRAIN_PROVIDER]
    lines = ["| hdim | causal | seqlen | " + " | ".join(f"{p} ms" for p in providers) + f" | {TRAIN_PROVIDER} TF/s | "
             + " | ".join(f"fp8 / {p}" for p in others) + " |",
             "|---|---|---|" + "---|" * (2 * len(providers))]
    for case in dict.fromkeys(m.case for m in measurements):
        steps = {m.provider: step_ms(m) for m in measurements if m.case == case}
        fp8_ms = steps.get(TRAIN_PROVIDER)
        cells = [f"{steps[p]:.3f}" if steps.get(p) else "-" for p in providers]
        rate = case.step_flops() / fp8_ms / 1e9 if fp8_ms else None
        ratios = [f"{steps[p] / fp8_ms:.2f}x" if fp8_ms and steps.get(p) else "-" for p in others]
        lines.append(f"| {case.head_dim} | {int(case.causal)} | {case.seqlen} | " + " | ".join(cells)
                     + f" | {format_rate(rate)} | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def run_fp8_training(args: argparse.Namespace, env: dict) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    providers = (args.providers or _baseline(on_gpu)) + [TRAIN_PROVIDER]
    grid = _grid(args, on_gpu, default_head_dims=(128,))
    env["matmul_tflops"] = measured_matmul_tflops(device)
    print(f"# {env.get('device')}  torch {env['torch']}  triton {env['triton']}  commit {env['commit']}  "
          f"bf16 matmul {format_rate(env['matmul_tflops'])} TFLOP/s", flush=True)
    return _run_grid(args, env, "fp8_train", grid, lambda case: measure_training_case(case, device, providers),
                     lambda measurements: training_table(measurements, providers))


def run_fp8(args: argparse.Namespace, env: dict) -> int:
    if args.varlen or args.providers and any(p in VARLEN_PROVIDERS for p in args.providers):
        print("flashattn bench: error: --dtype fp8 times dense calls only", file=sys.stderr)
        return EXIT_USAGE
    return run_fp8_training(args, env) if args.training else run_fp8_forward(args, env)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="flashattn bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
