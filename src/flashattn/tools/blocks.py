"""Time flashattn's kernels over candidate tile configs for one shape on this GPU (``flashattn blocks``).

The tile table in ``configs.py`` is written by hand from these sweeps, so a sweep must never crown a
config that computes the wrong thing: each candidate is checked against a float32 SDPA reference
before it is timed (Triton has been seen to compile a wrong kernel for some configs), and a candidate
that is wrong or fails to compile is reported as WRONG or by its exception's class name, never as the
winner. Beside each timing it prints what ``iomodel`` says about the tiling, so that a number can be
read against a reason: the shared memory a program holds, how often the streamed tensor is re-read,
and how many programs each SM gets.

Without a CUDA GPU nothing can be timed; ``--interpret-check`` (automatic when TRITON_INTERPRET=1 and
FLASHATTN_BACKEND=triton) still runs every candidate once on a tiny shape, to catch a config that
fails to compile or computes garbage before GPU time is spent on it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .iomodel import (
    DTYPE_BYTES,
    AttentionProblem,
    BlockShape,
    InvalidArgument,
    Tiling,
    backward_flops,
    flashattn_backward_bytes,
    flashattn_forward_bytes,
    forward_flops,
)
from .units import format_bytes, positive_int

EXIT_USAGE = 2  # argparse's exit status for bad arguments; ``run`` uses it for bad values too
MAX_HEAD_DIM = 256  # the interface's limit, and the last bucket of the tile table
HOPPER_SMS = 132  # H100/H200 SXM: the SM count the model assumes when no GPU is visible
HOPPER_SMEM_PER_BLOCK = 227 * 1024  # Hopper's opt-in shared memory per block, when no GPU is visible
MAX_REGISTERS_PER_THREAD = 255  # since Volta

# (BLOCK_M, BLOCK_N, num_warps, num_stages[, flags]) per kernel: padded head dims up to 128, then 256; the flags are
# TileConfig's, in its field order. The single source: benchmarks/sweep_blocks.py imports these.
Candidate = tuple
CANDIDATES: dict[str, list[Candidate]] = {
    "forward": [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 4),
                (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 4, 2), (64, 128, 4, 3), (128, 64, 8, 2)],
    # 128 x 64 on 8 warps: the hdim-256 winner, and in the sm90 SASS free of spills at hdim 64 and 128,
    # where the table's 64 x 64 x 4 x 2 spills in its loop at hdim 128
    "dkdv": [(32, 128, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 3),
             (32, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 1), (128, 64, 8, 2)],
    "dq": [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 4, 3), (64, 128, 8, 2), (128, 128, 8, 2),
           (128, 64, 4, 3), (128, 64, 8, 3)],
}
CANDIDATES_256: dict[str, list[Candidate]] = {
    "forward": [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 2), (128, 64, 8, 1), (64, 64, 4, 3)],
    # the table's 128 x 64, whose loop spills least, and smaller tiles
    "dkdv": [(64, 64, 8, 2), (32, 32, 4, 2), (128, 64, 8, 1), (64, 64, 8, 1)],
    "dq": [(64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 1), (64, 64, 4, 2), (128, 64, 8, 2)],
}
KERNEL_PHASES = ("forward", "dkdv", "dq")
# --phase -> the kernels whose config is swept; a backward candidate is timed as the whole backward
PHASES = {"forward": ("forward",), "backward": ("dkdv", "dq"), "dkdv": ("dkdv",), "dq": ("dq",),
          "both": KERNEL_PHASES}
# Relative error (max |x - ref| / max |ref|) above which a candidate is WRONG. A miscompiled kernel is
# off by O(1) or not finite; these leave a wide margin over each dtype's honest rounding error.
TOLERANCE = {2: 0.05, 4: 1e-3}  # by dtype bytes; fp16 is held to bf16's bound, which is loose for it
GRAD_TOLERANCE_FACTOR = 2  # gradients round once more (dS = P * (dP - delta)) than the output


def candidates_for(phase: str, head_dim: int) -> list[Candidate]:
    """The default candidates of one kernel: the 256-wide head dims get smaller tiles (shared memory)."""
    from ..configs import padded_head_dim

    return list((CANDIDATES_256 if padded_head_dim(head_dim) > 128 else CANDIDATES)[phase])


# label suffix -> the position of TileConfig's flag in a candidate (TileConfig(*candidate)); the register
# cap (+rN) sits at REGISTER_CAP, between the flags, in TileConfig's field order
FLAG_POSITIONS = {"tma": 4, "every": 6, "keyrows": 7, "peel": 8, "hopper": 9, "persistent": 10, "consumers3": 11,
                  "slices": 12}
FLAG_NAMES = tuple(FLAG_POSITIONS)
REGISTER_CAP = 5


def candidate_label(candidate: Candidate) -> str:
    suffixes = {position: name for name, position in FLAG_POSITIONS.items()}
    flags = []
    for position in range(4, len(candidate)):
        if candidate[position]:
            flags.append(f"r{candidate[position]}" if position == REGISTER_CAP else suffixes[position])
    return "x".join(str(x) for x in candidate[:4]) + "".join(f"+{name}" for name in flags)


def parse_candidates(text: str) -> list[Candidate]:
    """An argparse type: ``BMxBNxWARPSxSTAGES`` configs, comma separated (``16x16x1x1,32x16x1x1``);
    any config may end in ``+tma`` (TMA tensor descriptors; sm90), a dK/dV config in ``+every`` (one masked loop,
    ``TileConfig.mask_every_block``), ``+keyrows`` (``TileConfig.key_rows``) or ``+peel``
    (``TileConfig.peel_diagonal``), any config in ``+hopper`` (the Hopper kernels, ``TileConfig.hopper``; forward
    and dQ 128 x BLOCK_N x 8 x STAGES, dK/dV BLOCK_M query rows x BLOCK_N (64 or 128) keys x 8 x STAGES), a forward
    one with ``+persistent``, a forward or dQ one with ``+consumers3`` (``TileConfig.persistent``,
    ``TileConfig.three_consumers``), a dK/dV one with ``+slices`` (``TileConfig.key_slices``: 128 keys, 64 a
    warpgroup with both gradients),
    any config in ``+rN`` (at most N registers a thread, ``TileConfig.max_registers``)."""
    found: list[Candidate] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        numbers, *flags = part.lower().split("+")
        caps = [int(flag[1:]) for flag in flags if re.fullmatch(r"r\d+", flag)]
        flags = [flag for flag in flags if not re.fullmatch(r"r\d+", flag)]
        if len(caps) > 1:
            raise argparse.ArgumentTypeError(f"{part}: at most one register cap +rN")
        if any(not 24 <= cap <= MAX_REGISTERS_PER_THREAD for cap in caps):
            raise argparse.ArgumentTypeError(f"{part}: a register cap +rN needs 24 <= N <= "
                                             f"{MAX_REGISTERS_PER_THREAD}")
        unknown = set(flags) - set(FLAG_NAMES)
        if unknown:
            raise argparse.ArgumentTypeError(f"{part}: unknown flag(s) {sorted(unknown)}; expected "
                                             f"{' and '.join('+' + f for f in FLAG_NAMES)}")
        fields = numbers.split("x")
        try:
            block_m, block_n, num_warps, num_stages = (int(f) for f in fields)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected BLOCK_MxBLOCK_NxWARPSxSTAGES like 128x64x8x3, "
                                             f"got {part!r}") from None
        try:
            BlockShape(block_m, block_n)  # the kernels' own constraint on the tiles
        except InvalidArgument as error:
            raise argparse.ArgumentTypeError(f"{part}: {error}") from None
        if num_warps not in (1, 2, 4, 8, 16, 32):
            raise argparse.ArgumentTypeError(f"{part}: num_warps must be a power of two up to 32, got {num_warps}")
        if num_stages < 1:
            raise argparse.ArgumentTypeError(f"{part}: num_stages must be >= 1, got {num_stages}")
        candidate: list = [block_m, block_n, num_warps, num_stages] + [False] * (max(FLAG_POSITIONS.values()) - 3)
        for name, position in FLAG_POSITIONS.items():
            candidate[position] = name in flags
        candidate[REGISTER_CAP] = caps[0] if caps else None
        found.append(tuple(candidate))
    if not found:
        raise argparse.ArgumentTypeError(f"no config in {text!r}")
    return found


# ---------------------------------------------------------------------------------------------
# The shape and what the IO model says about a candidate
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One attention call (no GQA: the sweep is about tiles, and kv heads = heads keeps it simple)."""

    batch: int
    seqlen: int
    heads: int
    head_dim: int
    dtype: str  # a key of iomodel.DTYPE_BYTES
    causal: bool

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def problem(self) -> AttentionProblem:
        return AttentionProblem(self.batch, self.seqlen, self.seqlen, self.heads, self.heads, self.head_dim,
                                self.dtype_bytes, self.causal)

    def torch_dtype(self):
        import torch

        return {2: torch.float16 if self.dtype in ("fp16", "float16") else torch.bfloat16, 4: torch.float32}[
            self.dtype_bytes]


@dataclass(frozen=True)
class Estimate:
    """The IO model's view of one candidate on one shape."""

    smem_bytes: int  # tiles held per program: the resident ones once, the streamed ones x num_stages
    reread_bytes: int  # HBM bytes of the streamed tensors (forward, dq: K/V; dkdv: Q/dO/lse/delta)
    reread_factor: float  # those bytes over the tensors' own size: how many times each is read
    programs: int  # the kernel's grid
    programs_per_sm: float
    accumulator_regs: int = 0  # 32-bit registers per thread for the fp32 tiles: see accumulator_registers


def shared_memory_bytes(phase: str, candidate: Candidate, head_dim: int, dtype_bytes: int) -> int:
    """Shared memory one program holds, counted as its tiles: a lower bound on what Triton allocates.

    Tiles are ``padded_head_dim`` wide, as the kernels load them. The forward keeps its q tile and
    streams K and V; dK/dV keeps its K and V tiles and streams q and dO; dQ keeps q and dO and streams
    K and V. Triton software-pipelines the streamed loads ``num_stages`` deep, so those count that
    many times. The score tile and the accumulators live in registers and are not counted.
    """
    from ..configs import padded_head_dim

    block_m, block_n, _, num_stages = candidate[:4]
    width = padded_head_dim(head_dim)
    held, streamed = {
        "forward": (block_m, 2 * block_n),
        "dkdv": (2 * block_n, 2 * block_m),
        "dq": (2 * block_m, 2 * block_n),
    }[phase]
    return (held + num_stages * streamed) * width * dtype_bytes


def grid_programs(phase: str, candidate: Candidate, shape: Shape) -> int:
    """The launch grid of ``ops.py``: query blocks x heads, or key blocks x kv heads for dK/dV."""
    block_m, block_n = candidate[:2]
    rows = block_n if phase == "dkdv" else block_m
    return -(-shape.seqlen // rows) * shape.batch * shape.heads


def accumulator_registers(phase: str, candidate: Candidate, head_dim: int, dtype_bytes: int) -> int:
    """32-bit registers per thread that one program's fp32 tiles take, at least: a lower bound on its
    register use, to read against the 255 a thread may have (above it, certain spills; near it, likely).

    The tiles live in the registers of the program's ``32 * num_warps`` threads: the forward's output
    accumulator (BLOCK_M x d) and score tile (BLOCK_M x BLOCK_N); dK/dV's two accumulators
    (2 x BLOCK_N x d) and its score and dP tiles
    (2 x BLOCK_M x BLOCK_N); dQ's accumulator (BLOCK_M x d) and its score and dP tiles. float32 inputs add
    a Kahan compensation tile per accumulator. Operand tiles, pointers and masks come on top and are not
    counted.
    """
    from ..configs import padded_head_dim

    block_m, block_n, num_warps = candidate[:3]
    width = padded_head_dim(head_dim)
    accumulators, scores = {
        "forward": (block_m * width, block_m * block_n),
        "dkdv": (2 * block_n * width, 2 * block_m * block_n),
        "dq": (block_m * width, 2 * block_m * block_n),
    }[phase]
    if dtype_bytes == 4:
        accumulators *= 2
    return -(-(accumulators + scores) // (32 * num_warps))


def estimate(phase: str, candidate: Candidate, shape: Shape, sms: int) -> Estimate:
    """Shared memory, re-reads (from ``iomodel``'s byte counts for this tiling) and programs per SM."""
    problem = shape.problem()
    tiling = Tiling.uniform(candidate[0], candidate[1])
    transfers = (flashattn_forward_bytes(problem, tiling) if phase == "forward"
                 else flashattn_backward_bytes(problem, tiling))
    rereads = [t for t in transfers if t.kernel == phase and t.term == "reread"]
    reread_bytes = sum(t.nbytes for t in rereads)
    once_bytes = sum(t.once_nbytes for t in rereads)
    programs = grid_programs(phase, candidate, shape)
    return Estimate(shared_memory_bytes(phase, candidate, shape.head_dim, shape.dtype_bytes), reread_bytes,
                    reread_bytes / once_bytes, programs, programs / sms,
                    accumulator_registers(phase, candidate, shape.head_dim, shape.dtype_bytes))


# ---------------------------------------------------------------------------------------------
# Checking and timing
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    phase: str
    config: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    status: str  # "ok", "WRONG", or the exception's class name
    max_error: float | None  # max |x - ref| / max |ref| over the output (and, backward, the gradients)
    ms: float | None
    tflops: float | None
    smem_bytes: int
    reread_bytes: int
    reread_factor: float
    programs: int
    programs_per_sm: float
    accumulator_regs: int = 0
    best: bool = False


class _Case:
    """Inputs and the float32 SDPA reference of one shape, built once and shared by its candidates."""

    def __init__(self, shape: Shape, device, backward: bool):
        import torch
        import torch.nn.functional as F

        generator = torch.Generator(device=device).manual_seed(0)
        size = (shape.batch, shape.seqlen, shape.heads, shape.head_dim)
        dtype = shape.torch_dtype()
        self.q, self.k, self.v = (torch.randn(size, device=device, dtype=dtype, generator=generator)
                                  .requires_grad_(backward) for _ in range(3))
        self.dout = torch.randn(size, device=device, dtype=dtype, generator=generator)
        leaves = [x.detach().float().requires_grad_(backward) for x in (self.q, self.k, self.v)]
        expected = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves),
                                                  is_causal=shape.causal).transpose(1, 2)
        self.expected = [expected.detach()]
        if backward:
            self.expected_grads = list(torch.autograd.grad(expected, leaves, self.dout.float()))
        self.shape = shape


def _relative_error(actual, expected) -> float:
    """max |actual - expected| / max |expected|; inf where actual is not finite."""
    import torch

    if not torch.isfinite(actual).all():
        return float("inf")
    scale = expected.abs().max().item() or 1.0
    return (actual.float() - expected).abs().max().item() / scale


def _time_ms(fn: Callable[[], object]) -> float:
    """Median GPU milliseconds of ``fn``, timed as the bench times (warm-up included)."""
    import torch

    from .timing import median_seconds

    return median_seconds(fn, torch.device("cuda")) * 1e3


def run_candidate(phase: str, candidate: Candidate, case: _Case, timed: bool) -> tuple[str, float | None, float | None]:
    """Check one candidate against the reference, then (``timed``) time it: (status, error, ms).

    A backward candidate is timed as the whole backward (delta, dK/dV and dQ kernels), with the other
    backward kernel on its table config: what a user of that config would see.
    """
    import torch

    from ..configs import TileConfig, use_config
    from ..interface import flash_attn_func

    shape = case.shape
    q, k, v, dout = case.q, case.k, case.v, case.dout
    tolerance = TOLERANCE[shape.dtype_bytes]
    try:
        with use_config(phase, TileConfig(*candidate)):
            out = flash_attn_func(q, k, v, causal=shape.causal)
            error = _relative_error(out, case.expected[0])
            if phase == "forward":
                ok = error <= tolerance
                qd, kd, vd = q.detach(), k.detach(), v.detach()  # time the kernel, not autograd's bookkeeping
                fn = lambda: flash_attn_func(qd, kd, vd, causal=shape.causal)  # noqa: E731
            else:
                grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                grad_error = max(_relative_error(g, e) for g, e in zip(grads, case.expected_grads, strict=True))
                ok = error <= tolerance and grad_error <= GRAD_TOLERANCE_FACTOR * tolerance
                error = max(error, grad_error)
                fn = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
            if not ok:
                return "WRONG", error, None
            return "ok", error, _time_ms(fn) if timed else None
    except Exception as exc:  # out of shared memory, a compile failure: report it and go on
        return type(exc).__name__, None, None


def validation_shape(shape: Shape, candidate: Candidate) -> Shape:
    """A tiny shape that still crosses block boundaries: three blocks of the larger tile, the last partial."""
    seqlen = min(shape.seqlen, 2 * max(candidate[:2]) + 1)
    return replace(shape, batch=1, heads=1, seqlen=seqlen)


def sweep(shape: Shape, candidates: dict[str, list[Candidate]], *, device, timed: bool, sms: int,
          progress: Callable[[Row], None] | None = None) -> list[Row]:
    """Check (and, ``timed``, time) every candidate of every kernel in ``candidates``; mark the best.

    Timed, every candidate runs on ``shape``; untimed, each runs once on its ``validation_shape``.
    The IO-model columns always describe ``shape``.
    """
    backward = any(phase != "forward" for phase in candidates)
    cases: dict[Shape, _Case] = {}
    problem = shape.problem()
    rows: list[Row] = []
    for phase, phase_candidates in candidates.items():
        flops = forward_flops(problem) if phase == "forward" else backward_flops(problem)
        for candidate in phase_candidates:
            run_shape = shape if timed else validation_shape(shape, candidate)
            if run_shape not in cases:
                cases[run_shape] = _Case(run_shape, device, backward)
            status, error, ms = run_candidate(phase, candidate, cases[run_shape], timed)
            model = estimate(phase, candidate, shape, sms)
            row = Row(phase, candidate_label(candidate), *candidate[:4], status=status, max_error=error, ms=ms,
                      tflops=None if ms is None else flops / ms / 1e9, **asdict(model))
            rows.append(row)
            if progress is not None:
                progress(row)
    for phase in candidates:
        timed_rows = [r for r in rows if r.phase == phase and r.status == "ok" and r.tflops is not None]
        if timed_rows:
            max(timed_rows, key=lambda r: r.tflops).best = True
    return rows


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def format_table(rows: list[Row], smem_limit: int) -> str:
    """One line per candidate; ``*`` marks the best of its kernel, ``!`` an estimate over the limit."""
    header = ["", "kernel", "BMxBNxWxS", "smem", "re-reads", "progs/SM", "acc regs", "ms", "TFLOP/s", "error",
              "status"]
    body = [[
        "*" if r.best else "",
        r.phase,
        r.config,
        format_bytes(r.smem_bytes) + ("!" if r.smem_bytes > smem_limit else ""),
        f"{r.reread_factor:.0f}x {format_bytes(r.reread_bytes)}",
        f"{r.programs_per_sm:.1f}",
        f"{r.accumulator_regs}" + ("!" if r.accumulator_regs > MAX_REGISTERS_PER_THREAD else ""),
        "-" if r.ms is None else f"{r.ms:.3f}",
        "-" if r.tflops is None else f"{r.tflops:.1f}",
        "-" if r.max_error is None else f"{r.max_error:.1e}",
        r.status,
    ] for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i < 3 or i == len(header) - 1 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(line, widths, strict=True))).rstrip()
                     for line in [header, *body])


def plot_rows(rows: list[Row], png_path: Path, title: str) -> None:
    """TFLOP/s per candidate as bars, one panel per kernel, the best in a second colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = list(dict.fromkeys(r.phase for r in rows))
    fig, axes = plt.subplots(1, len(phases), figsize=(max(4.0, 0.5 * len(rows) + 2), 3.6), squeeze=False)
    for ax, phase in zip(axes[0], phases, strict=True):
        mine = [r for r in rows if r.phase == phase]
        ax.bar(range(len(mine)), [r.tflops or 0.0 for r in mine],
               color=["tab:orange" if r.best else "tab:blue" for r in mine])
        ax.set_xticks(range(len(mine)), [r.config if r.status == "ok" else f"{r.config}\n{r.status}" for r in mine],
                      rotation=60, ha="right", fontsize=7)
        ax.set_title(phase, fontsize=9)
        ax.set_ylabel("TFLOP/s")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# CLI glue for ``flashattn blocks``
# ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqlen", type=positive_int, default=4096, help="default 4096")
    parser.add_argument("--head-dim", type=positive_int, default=128, help=f"1 to {MAX_HEAD_DIM} (default 128)")
    parser.add_argument("--heads", type=positive_int, default=None,
                        help="default 2048 // head dim, as the tile table was measured")
    parser.add_argument("--batch", type=positive_int, default=None,
                        help="default 16384 // seqlen (at least 1), as the tile table was measured")
    parser.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bf16", help="default bf16")
    parser.add_argument("--causal", action="store_true", help="causal mask")
    parser.add_argument("--phase", choices=tuple(PHASES), default="forward",
                        help="forward sweeps the forward kernel; backward the dK/dV and dQ kernels, each timed "
                             "as the whole backward (dkdv or dq: one of them); both all three (default forward)")
    parser.add_argument("--candidates", type=parse_candidates, default=None, metavar="BMxBNxWxS[,...]",
                        help="sweep these configs for every swept kernel instead of the built-in lists; "
                             "+tma, +every (dK/dV in one masked loop), "
                             "+keyrows (dK/dV products with the keys along the rows), +peel (the causal "
                             "diagonal out of the dK/dV loop), +hopper (the Hopper kernels; forward "
                             "+persistent; forward and dQ +consumers3; dK/dV +slices) set TileConfig's flags, "
                             "+rN a register cap")
    parser.add_argument("--interpret-check", action="store_true",
                        help="no timings: run each candidate once on a tiny shape to validate it (automatic "
                             "without a GPU when TRITON_INTERPRET=1 and FLASHATTN_BACKEND=triton)")
    parser.add_argument("--sms", type=positive_int, default=None,
                        help=f"SM count for programs/SM (default: the GPU's, or {HOPPER_SMS} without one)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="also draw TFLOP/s per candidate to this PNG (needs matplotlib and timings)")


def _usage_error(message: str) -> int:
    print(f"flashattn blocks: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    """Sweep, print the table (or JSON), optionally plot; bad values and no GPU exit 2."""
    if args.head_dim > MAX_HEAD_DIM:
        return _usage_error(f"argument --head-dim: flashattn supports head dims up to {MAX_HEAD_DIM}, "
                            f"got {args.head_dim}")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        return _usage_error(f"argument --plot: expected a .png file, got {str(args.plot)!r}")

    import torch

    from ..backend import backend_override, interpreting

    try:
        backend = backend_override()
    except ValueError as error:
        return _usage_error(str(error))
    on_gpu = torch.cuda.is_available()
    interpreter = interpreting() and backend == "triton"
    if not on_gpu and not (args.interpret_check or interpreter):
        return _usage_error("timings need a CUDA GPU, and none is visible. To only validate the candidates on "
                            "a tiny shape, pass --interpret-check (with TRITON_INTERPRET=1 "
                            "FLASHATTN_BACKEND=triton it runs the Triton kernels in the interpreter).")
    if on_gpu and backend == "torch":
        return _usage_error("FLASHATTN_BACKEND=torch ignores tile configs: unset it to sweep the Triton kernels")
    timed = on_gpu and not args.interpret_check
    device = torch.device("cuda" if on_gpu and not interpreter else "cpu")

    shape = Shape(batch=args.batch or max(1, 16384 // args.seqlen), seqlen=args.seqlen,
                  heads=args.heads or max(1, 2048 // args.head_dim), head_dim=args.head_dim, dtype=args.dtype,
                  causal=args.causal)
    candidates = {phase: list(args.candidates) if args.candidates else candidates_for(phase, args.head_dim)
                  for phase in PHASES[args.phase]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_name, sms = props.name, args.sms or props.multi_processor_count
        smem_limit = getattr(props, "shared_memory_per_block_optin", HOPPER_SMEM_PER_BLOCK)
    else:
        device_name = "cpu (Triton interpreter)" if interpreter else f"cpu (backend {backend or 'torch'})"
        sms, smem_limit = args.sms or HOPPER_SMS, HOPPER_SMEM_PER_BLOCK

    notes = []
    if not timed:
        notes.append("validation only: timings need a CUDA GPU" if not on_gpu
                     else "validation only (--interpret-check): no timings")
        notes.append("each candidate ran once on batch 1, 1 head, seqlen min(seqlen, 2 x larger tile + 1); "
                     "the model columns describe the requested shape")
        if backend != "triton" and not on_gpu:
            notes.append("the torch backend ignores tile configs: set TRITON_INTERPRET=1 FLASHATTN_BACKEND=triton "
                         "to validate the Triton kernels")
    title = (f"{device_name}: batch {shape.batch}, seqlen {shape.seqlen}, {shape.heads} heads, head dim "
             f"{shape.head_dim}, {shape.dtype}, {'causal' if shape.causal else 'non-causal'}")
    if not args.json:
        print(title)
        for note in notes:
            print(f"note: {note}")
        print(flush=True)
    elif notes:
        print(f"flashattn blocks: {notes[0]}", file=sys.stderr)

    def progress(row: Row) -> None:  # a GPU sweep takes minutes: show it moving, away from stdout
        timing = "" if row.tflops is None else f" {row.tflops:.1f} TFLOP/s"
        print(f"  {row.phase} {row.config}: {row.status}{timing}", file=sys.stderr, flush=True)

    rows = sweep(shape, candidates, device=device, timed=timed, sms=sms, progress=progress)
    if args.json:
        print(json.dumps(to_json(shape, rows, device_name, sms, smem_limit, timed, notes), indent=1))
    else:
        print(format_table(rows, smem_limit))
        print(f"\n* best of its kernel.  smem: tiles held per program, streamed ones x stages ('!': over the "
              f"{format_bytes(smem_limit)} limit).\nre-reads: HBM bytes of the streamed tensors (forward, dq: K/V; "
              f"dkdv: Q/dO) and how many times each is read, with no L2 reuse.\nprogs/SM: the grid over {sms} SMs.  "
              f"acc regs: 32-bit registers per thread of the fp32 tiles, a lower bound ('!': over "
              f"{MAX_REGISTERS_PER_THREAD}).\nerror: max |x - ref| / max |ref| of the output (and gradients) "
              "against float32 SDPA.")
    if args.plot is not None:
        if not timed:
            print("flashattn blocks: --plot skipped: no timings without a CUDA GPU", file=sys.stderr)
        else:
            plot_rows(rows, args.plot, title)
            print(f"plot: {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def to_json(shape: Shape, rows: list[Row], device: str, sms: int, smem_limit: int, timed: bool,
            notes: Sequence[str]) -> dict[str, Any]:
    best = {phase: next((r.config for r in rows if r.phase == phase and r.best), None)
            for phase in dict.fromkeys(r.phase for r in rows)}
    return {"shape": asdict(shape), "device": device, "timed": timed, "sms": sms, "smem_limit_bytes": smem_limit,
            "notes": list(notes), "best": best, "results": [asdict(r) for r in rows]}


def main(argv: list[str] | None = None) -> int:
    """``python -m flashattn.tools.blocks``: the same as ``flashattn blocks``."""
    parser = argparse.ArgumentParser(prog="flashattn blocks", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
