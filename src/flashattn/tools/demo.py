"""A side-by-side demo: flashattn against standard (materializing) attention on this machine.

For a few sequence lengths it shows that flashattn is exact (its error against a float64 oracle is
no worse than standard attention's in the same dtype), what each costs in time, and how the extra
memory grows: O(N) for flashattn, which never builds the N x N score matrix, against O(N^2) for
standard attention, which builds it (and the probabilities) in full.

Run it with ``python -m flashattn demo`` or :func:`run_demo`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from ..interface import flash_attn_func
from ..reference import attention_ref
from ..testing import error_bound, rounding_error
from .timing import SPREAD_THRESHOLD, Timing, synchronize, time_call
from .units import format_bytes

GIB = 1024**3
# The oracle holds about this many float64 N x N temporaries at once (scores, scaled scores, masked
# scores, probabilities): used to decide whether it fits the memory budget.
ORACLE_SCORE_COPIES = 4
DEFAULT_ORACLE_BUDGET_BYTES = 2 * GIB

DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class DemoSettings:
    """The problem the demo runs: one shape per sequence length, q/k/v of (batch, seqlen, heads, headdim)."""

    device: torch.device
    seqlens: tuple[int, ...]
    batch: int
    heads: int
    headdim: int
    dtype: torch.dtype
    causal: bool


@dataclass(frozen=True)
class OracleSlice:
    """Which part of the output the float64 oracle checks when the whole of it would not fit.

    Attention rows are independent, so checking a subset of (batch, head) pairs, or the last query rows
    of one head (the last rows keep the bottom-right causal alignment), is still an exact check of them.
    """

    batches: int
    heads: int
    rows: int  # the last `rows` query rows

    def of(self, x: torch.Tensor) -> torch.Tensor:
        """The slice of a (batch, seqlen_q, heads, headdim) query or output tensor."""
        return x[: self.batches, x.shape[1] - self.rows :, : self.heads]

    def of_keys(self, x: torch.Tensor) -> torch.Tensor:
        """The slice of a key or value tensor: every key, since each query row may see all of them."""
        return x[: self.batches, :, : self.heads]


@dataclass
class PathResult:
    """What one attention implementation cost at one sequence length; None where it could not run."""

    timing: Timing | None = None
    extra_bytes: int | None = None
    out_of_memory: bool = False  # the call itself did not fit: no output, no time
    timing_out_of_memory: bool = False  # the call fit, but the timing harness's extra buffers did not

    @property
    def seconds(self) -> float | None:
        return None if self.timing is None else self.timing.seconds


@dataclass
class DemoRow:
    """Everything measured at one sequence length."""

    seqlen: int
    flash: PathResult
    standard: PathResult
    flash_error: float | None = None
    standard_error: float | None = None
    oracle_rounding: float | None = None  # max |oracle cast to the dtype - oracle|
    oracle_note: str = ""

    @property
    def tolerance(self) -> float | None:
        """The exactness bar: twice standard attention's own error plus twice the dtype's rounding."""
        if self.standard_error is None or self.oracle_rounding is None:
            return None
        return error_bound(self.standard_error, self.oracle_rounding, factor=2.0)

    @property
    def verdict(self) -> str:
        tolerance = self.tolerance
        if tolerance is None or self.flash_error is None:
            return "n/a"
        return "PASS" if self.flash_error <= tolerance else "FAIL"


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


def pick_device(device: str | torch.device | None) -> torch.device:
    """The requested device, else the local GPU if there is one, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chosen = torch.device(device)
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but torch sees no CUDA GPU")
    if chosen.type not in ("cpu", "cuda"):
        raise ValueError(f"the demo runs on 'cpu' or 'cuda', got {chosen}")
    return chosen


def parse_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A dtype from its name; the default is what flashattn is for on each device (bf16 GPU, fp32 CPU)."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPE_NAMES[dtype.lower()]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}") from None


def demo_settings(
    device: str | torch.device | None = None,
    seqlens: Sequence[int] | None = None,
    *,
    dtype: str | torch.dtype | None = None,
    batch: int | None = None,
    heads: int | None = None,
    headdim: int | None = None,
    causal: bool = False,
) -> DemoSettings:
    """Fill in the defaults: small on the CPU (the whole demo in well under a minute on two cores),
    realistic on a GPU (long enough for standard attention to run out of memory)."""
    chosen = pick_device(device)
    on_gpu = chosen.type == "cuda"
    if seqlens is None:
        seqlens = (1024, 2048, 4096, 8192, 16384) if on_gpu else (256, 512, 1024, 2048)
    settings = DemoSettings(
        device=chosen,
        seqlens=tuple(int(n) for n in seqlens),
        batch=batch if batch is not None else (2 if on_gpu else 1),
        heads=heads if heads is not None else (16 if on_gpu else 8),
        headdim=headdim if headdim is not None else (128 if on_gpu else 64),
        dtype=parse_dtype(dtype, chosen),
        causal=causal,
    )
    if not settings.seqlens or min(settings.seqlens) < 1:
        raise ValueError(f"seqlens must be positive, got {list(settings.seqlens)}")
    for name in ("batch", "heads", "headdim"):
        if getattr(settings, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(settings, name)}")
    return settings


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: the profiler's C++ side prints a line on every start
    and stop that Python cannot turn off. Used only around those two calls, never around user code."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass(frozen=True)
class AllocationWindow:
    """What a call allocated, relative to what was allocated just before it.

    ``peak``: the most bytes it had allocated at any moment (its output included); ``end``: what it
    left allocated when it returned (its output, plus anything it saved, e.g. for a backward; negative
    when it freed more than it kept).
    """

    peak: int
    end: int


def allocation_window_cpu(fn: Callable[[], object]) -> AllocationWindow:
    """The allocations of fn on the CPU, from the profiler's allocation events.

    tracemalloc does not see torch's allocator and RSS is noisy, but torch.profiler with
    profile_memory=True records every CPU allocation and free with its size and time: the running sum
    of those, in time order, peaks at the extra memory fn needed and ends at what it kept.
    """
    from torch.profiler import ProfilerActivity, profile

    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():
        profiler.start()
    try:
        fn()
    finally:
        with _quiet_stderr():
            profiler.stop()
    events = sorted(
        (event for event in profiler.profiler.kineto_results.events()
         if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU),
        key=lambda event: event.start_ns(),
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return AllocationWindow(peak, live)


def allocation_window_cuda(fn: Callable[[], object], device: torch.device) -> AllocationWindow:
    """The allocations of fn on a CUDA device, from the caching allocator's counters (bytes handed out
    to tensors, not what the allocator reserved from the driver)."""
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return AllocationWindow(torch.cuda.max_memory_allocated(device) - before,
                            torch.cuda.memory_allocated(device) - before)


def allocation_window(fn: Callable[[], object], device: torch.device) -> AllocationWindow:
    # garbage that earlier work left in reference cycles would otherwise be collected inside the window, its frees
    # counted against fn
    gc.collect()
    if device.type == "cuda":
        return allocation_window_cuda(fn, device)
    return allocation_window_cpu(fn)


def peak_extra_bytes_cpu(fn: Callable[[], object]) -> int:
    """Peak bytes allocated by fn above what was live before it (its output included)."""
    return allocation_window_cpu(fn).peak


def peak_extra_bytes_cuda(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes the CUDA caching allocator handed out during fn above what was allocated before it
    (the inputs and anything else alive), its output included."""
    return allocation_window_cuda(fn, device).peak


def is_out_of_memory(error: BaseException) -> bool:
    """True for torch's out-of-memory errors, CUDA's and the CPU allocator's (a plain RuntimeError)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and "alloc" in message and "memory" in message


def free_cached_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_path(
    fn: Callable[[], torch.Tensor], device: torch.device
) -> tuple[PathResult, torch.Tensor | None]:
    """Run fn once for its peak extra memory (keeping the output for the error check), then time it.
    An out-of-memory error is a result ("OOM"), not a crash: it is what standard attention does at
    long sequence lengths."""
    result = PathResult()
    output: torch.Tensor | None = None

    def keep_output() -> None:
        nonlocal output
        output = fn()

    try:
        if device.type == "cuda":
            result.extra_bytes = peak_extra_bytes_cuda(keep_output, device)
        else:
            result.extra_bytes = peak_extra_bytes_cpu(keep_output)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise
        result.out_of_memory = True
        output = None
        free_cached_memory(device)
        return result, output
    try:
        result.timing = time_call(fn, device)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise
        result.timing_out_of_memory = True
        free_cached_memory(device)
    return result, output


def standard_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> Callable[[], torch.Tensor]:
    """Standard attention as the FlashAttention paper's Algorithm 0 writes it: S = Q K^T, P = softmax(S),
    O = P V, with S and P materialized in the input dtype; q, k, v in (batch, seqlen, heads, headdim), the
    causal mask aligned to the bottom right. A zero-argument callable that runs it.

    The demo's standard attention and the bench's ``naive`` provider; ``flashattn memory --measure`` and
    ``flashattn io --measure`` compare it against their models, so it moves no more than they count."""

    def run():
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        group = qh.shape[1] // kh.shape[1]
        if group > 1:  # GQA: a copy of K and V per query head, O(N d); skipped when there is no group
            kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
        # The scale goes on q (an O(N d) pass) rather than on the scores (an extra N x N round trip)
        scores = (qh * qh.shape[-1] ** -0.5) @ kh.transpose(-1, -2)
        if causal:
            sq, sk = scores.shape[-2:]
            hidden = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(sk - sq + 1)
            scores.masked_fill_(hidden, float("-inf"))  # in place: no second N x N tensor
        return (scores.softmax(-1) @ vh).transpose(1, 2)

    return run


def oracle_slice(settings: DemoSettings, seqlen: int, budget_bytes: int) -> OracleSlice | None:
    """The largest part of the output whose float64 oracle fits the budget, or None if no row fits."""
    row_bytes = seqlen * 8 * ORACLE_SCORE_COPIES  # one query row of float64 scores and its copies
    rows_that_fit = budget_bytes // row_bytes
    if rows_that_fit >= settings.batch * settings.heads * seqlen:
        return OracleSlice(settings.batch, settings.heads, seqlen)
    if rows_that_fit >= seqlen:
        return OracleSlice(1, min(settings.heads, rows_that_fit // seqlen), seqlen)
    if rows_that_fit >= 1:
        return OracleSlice(1, 1, int(rows_that_fit))
    return None


def _describe_slice(part: OracleSlice, settings: DemoSettings, seqlen: int) -> str:
    if part.rows < seqlen:
        return f"float64 oracle on the last {part.rows} of {seqlen} query rows of one head only"
    pairs, total = part.batches * part.heads, settings.batch * settings.heads
    return f"float64 oracle on {pairs} of {total} (batch, head) pairs only"


WARM_UP_SEQLEN = 16


def warm_up(settings: DemoSettings) -> None:
    """One small call of each path, unmeasured, so that what a first call sets up once for the process (the CPU
    path's exp kernel, Triton's compiled kernels) is not counted against the first length."""
    shape = (1, WARM_UP_SEQLEN, settings.heads, settings.headdim)
    q = torch.randn(shape, device=settings.device, dtype=settings.dtype)
    flash_attn_func(q, q, q, causal=settings.causal)
    standard_attention(q, q, q, settings.causal)()
    synchronize(settings.device)


def measure_seqlen(settings: DemoSettings, seqlen: int, oracle_budget_bytes: int, seed: int = 0) -> DemoRow:
    """All the numbers of one table row: memory and time of both paths, then both errors."""
    device, dtype = settings.device, settings.dtype
    generator = torch.Generator(device=device).manual_seed(seed + seqlen)
    shape = (settings.batch, seqlen, settings.heads, settings.headdim)
    q, k, v = (torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(3))
    causal = settings.causal

    def run_flash() -> torch.Tensor:
        return flash_attn_func(q, k, v, causal=causal)

    run_standard = standard_attention(q, k, v, causal)

    flash, flash_out = measure_path(run_flash, device)
    standard, standard_out = measure_path(run_standard, device)
    row = DemoRow(seqlen=seqlen, flash=flash, standard=standard)

    part = oracle_slice(settings, seqlen, oracle_budget_bytes)
    if part is None:
        needed = format_bytes(seqlen * 8 * ORACLE_SCORE_COPIES)
        row.oracle_note = (f"float64 oracle skipped: even one query row needs {needed}, "
                           f"over the {format_bytes(oracle_budget_bytes)} budget")
        return row
    if part != OracleSlice(settings.batch, settings.heads, seqlen):
        row.oracle_note = _describe_slice(part, settings, seqlen)
    q_part, k_part, v_part = part.of(q), part.of_keys(k), part.of_keys(v)
    try:
        oracle = attention_ref(q_part, k_part, v_part, causal=causal, upcast=True)[0]
    except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise
        free_cached_memory(device)
        row.oracle_note = "float64 oracle skipped: out of memory"
        return row
    row.oracle_rounding = rounding_error(oracle, dtype)
    if flash_out is not None:
        row.flash_error = (part.of(flash_out).double() - oracle).abs().max().item()
    if standard_out is None:  # standard attention ran out of memory: its error on the slice alone
        with contextlib.suppress(torch.cuda.OutOfMemoryError):
            standard_out = standard_attention(q_part, k_part, v_part, causal)()
            row.standard_error = (standard_out.double() - oracle).abs().max().item()
    else:
        row.standard_error = (part.of(standard_out).double() - oracle).abs().max().item()
    return row


# ---------------------------------------------------------------------------------------------
# Memory models: what each path must hold at least, by construction
# ---------------------------------------------------------------------------------------------


def flash_model_bytes(settings: DemoSettings, seqlen: int) -> int:
    """flashattn's unavoidable extra memory: the output and a float32 log-sum-exp per row. O(N)."""
    element = torch.finfo(settings.dtype).bits // 8
    output = settings.batch * seqlen * settings.heads * settings.headdim * element
    lse = settings.batch * settings.heads * seqlen * 4
    return output + lse


def standard_model_bytes(settings: DemoSettings, seqlen: int) -> int:
    """Standard attention's N x N matrices: the scores and the probabilities, in the dtype. O(N^2)."""
    element = torch.finfo(settings.dtype).bits // 8
    return 2 * settings.batch * settings.heads * seqlen * seqlen * element


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _spread_meaning(device: torch.device) -> str:
    if device.type == "cuda":
        return "the gap between the two agreeing rounds of triton's do_bench"
    return "the runs' interquartile range over their median (torch.utils.benchmark's adaptive_autorange)"


def format_error(error: float | None) -> str:
    return "-" if error is None else f"{error:.2e}"


def format_ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None or denominator == 0:
        return "-"
    return f"x{numerator / denominator:.1f}"


def _path_memory(path: PathResult) -> str:
    return "OOM" if path.out_of_memory else format_bytes(path.extra_bytes)


def _path_time(path: PathResult) -> str:
    if path.out_of_memory or path.timing_out_of_memory:
        return "OOM"
    return "-" if path.timing is None else path.timing.describe()


def _speedup(flash: PathResult, standard: PathResult) -> str:
    """Standard's time over flashattn's, marked '?' when either time did not settle."""
    ratio = format_ratio(standard.seconds, flash.seconds)
    unsettled = any(path.timing is not None and not path.timing.settled for path in (flash, standard))
    return f"{ratio}?" if unsettled and ratio != "-" else ratio


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                notes: Sequence[str] = ()) -> None:
    """A table with rich when it is installed (it is an optional dependency), else aligned plain text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _print_plain_table(title, headers, rows, notes)
        return
    table = Table(title=title, title_justify="left", caption="\n".join(notes) or None, caption_justify="left")
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    # Not a terminal (a pipe, a log, a test): no wrapping at rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    console.print()


def _print_plain_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                       notes: Sequence[str]) -> None:
    widths = [max(len(header), *(len(row[i]) for row in rows)) for i, header in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [cell.ljust(width) if index == 0 else cell.rjust(width)
                  for index, (cell, width) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(padded)

    print(title)
    print(line(headers))
    print("  ".join("-" * width for width in widths))
    for row in rows:
        print(line(row))
    for note in notes:
        print(note)
    print()


def _results_table(settings: DemoSettings, rows: Sequence[DemoRow]) -> None:
    headers = ["seqlen", "err flash", "err standard", "tolerance", "exact", "time flash", "time standard",
               "speedup", "mem flash", "mem standard"]
    table_rows = []
    for row in rows:
        speedup = _speedup(row.flash, row.standard)
        table_rows.append([
            str(row.seqlen), format_error(row.flash_error), format_error(row.standard_error),
            format_error(row.tolerance), row.verdict, _path_time(row.flash), _path_time(row.standard),
            speedup, _path_memory(row.flash), _path_memory(row.standard),
        ])
    notes = [
        "err: max |out - float64 oracle|; exact: PASS when err flash <= 2 * err standard + eps,",
        "     eps = 2 * max rounding error of the oracle cast to the dtype.",
        "standard: S = Q K^T, P = softmax(S), O = P V in the dtype (the bench's naive provider).",
        "time: median of runs repeated until their spread settles (as `flashattn bench` times), ± the spread:",
        f"      {_spread_meaning(settings.device)};",
        f"      'unsettled': the spread never came within {SPREAD_THRESHOLD:.0%}; '?': a speedup from such a time.",
    ]
    if any(path.timing is not None and not path.timing.settled for row in rows for path in (row.flash, row.standard)):
        notes.append("      unsettled times come from a busy machine: fewer CPU threads (--threads 1) are steadier.")
    notes.append("mem: peak extra memory of the call, measured (output included).")
    notes += [f"seqlen {row.seqlen}: {row.oracle_note}" for row in rows if row.oracle_note]
    shape = f"batch {settings.batch}, {settings.heads} heads, headdim {settings.headdim}"
    dtype_name = str(settings.dtype).removeprefix("torch.")
    title = (f"flashattn vs standard attention: {settings.device}, {dtype_name}, {shape}"
             f"{', causal' if settings.causal else ''}")
    print_table(title, headers, table_rows, notes)


def _growth_table(settings: DemoSettings, rows: Sequence[DemoRow]) -> None:
    headers = ["seqlen", "N growth", "flash measured", "flash model", "flash growth", "standard measured",
               "standard model", "standard growth", "standard / flash"]
    table_rows = []
    previous: DemoRow | None = None
    for row in rows:
        flash_model = flash_model_bytes(settings, row.seqlen)
        standard_model = standard_model_bytes(settings, row.seqlen)
        flash_measured = row.flash.extra_bytes
        standard_measured = None if row.standard.out_of_memory else row.standard.extra_bytes
        if previous is None:
            n_growth = flash_growth = standard_growth = "-"
        else:
            previous_standard = None if previous.standard.out_of_memory else previous.standard.extra_bytes
            n_growth = format_ratio(row.seqlen, previous.seqlen)
            flash_growth = format_ratio(flash_measured, previous.flash.extra_bytes)
            standard_growth = format_ratio(standard_measured, previous_standard)
            if standard_growth == "-":  # out of memory: the model still says how it grows
                previous_model = standard_model_bytes(settings, previous.seqlen)
                standard_growth = format_ratio(standard_model, previous_model) + " (model)"
        ratio = format_ratio(standard_measured, flash_measured)
        if ratio == "-":
            ratio = format_ratio(standard_model, flash_model) + " (model)"
        table_rows.append([
            str(row.seqlen), n_growth, format_bytes(flash_measured), format_bytes(flash_model), flash_growth,
            _path_memory(row.standard), format_bytes(standard_model), standard_growth, ratio,
        ])
        previous = row
    notes = [
        "model: flash = output + float32 log-sum-exp (B*H*N*4 bytes), O(N);",
        "       standard = scores + probabilities (2*B*H*N^2 * dtype bytes), O(N^2).",
        "growth: measured extra memory over the previous row's;",
        "        doubling N doubles flash and quadruples standard.",
    ]
    if settings.device.type == "cpu":
        notes += cpu_working_set_notes(settings)
    print_table("Extra memory: O(N) vs O(N^2)", headers, table_rows, notes)


def cpu_working_set_notes(settings: DemoSettings) -> list[str]:
    """What the CPU path holds besides the model's O(N): a working set of tiles, constant from BLOCK_M queries on."""
    from .. import cpu

    rows = cpu.block_m(settings.batch, settings.heads)
    tile = settings.batch * settings.heads * rows * cpu.BLOCK_N * 4
    return [
        f"flashattn's CPU path also holds a working set of a few float32 tiles, (B, H, {rows}, {cpu.BLOCK_N}) "
        f"scores ({format_bytes(tile)} each) and (B, H, {rows}, D) rows:",
        f"        it grows with N up to {rows} queries and stays the same from there, so the measured growth",
        "        falls below N's; at short lengths it can exceed standard attention's N x N matrices.",
    ]


def _verdict(rows: Sequence[DemoRow]) -> str:
    checked = [row for row in rows if row.verdict in ("PASS", "FAIL")]
    if not checked:
        return "exact: not checked (the float64 oracle did not fit in memory at any length)"
    worst = max(row.flash_error for row in checked if row.flash_error is not None)
    failed = [row.seqlen for row in checked if row.verdict == "FAIL"]
    if failed:
        return (f"NOT exact: max error {worst:.2e}, outside the dtype tolerance at seqlen "
                f"{', '.join(map(str, failed))} (FAIL)")
    return (f"exact: max error {worst:.2e} within the dtype tolerance "
            f"(PASS at {len(checked)} of {len(rows)} lengths)")


def _backend_name(device: torch.device) -> str:
    from ..backend import backend_override

    override = backend_override()
    if override is not None:
        return f"{override} (FLASHATTN_BACKEND)"
    return "triton" if device.type == "cuda" else "torch (blocked PyTorch)"


def run_demo(
    device: str | torch.device | None = None,
    seqlens: list[int] | None = None,
    *,
    dtype: str | torch.dtype | None = None,
    batch: int | None = None,
    heads: int | None = None,
    headdim: int | None = None,
    causal: bool = False,
    oracle_budget_bytes: int = DEFAULT_ORACLE_BUDGET_BYTES,
    seed: int = 0,
    threads: int | None = None,
) -> None:
    """Measure flashattn against standard attention at each sequence length and print two tables and a
    verdict. Defaults suit the device found (see :func:`demo_settings`).

    ``threads`` sets torch's CPU thread count for the run only (restored after): on a machine whose
    cores are busy with other work, fewer threads than cores gives far steadier CPU timings.
    """
    settings = demo_settings(device, seqlens, dtype=dtype, batch=batch, heads=heads, headdim=headdim,
                             causal=causal)
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    previous_threads = torch.get_num_threads()
    print(f"flashattn demo on {settings.device} (backend: {_backend_name(settings.device)}, "
          f"CPU threads: {threads or previous_threads}), seqlens {', '.join(map(str, settings.seqlens))}")
    rows = []
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        with torch.no_grad():
            warm_up(settings)
            for seqlen in settings.seqlens:
                rows.append(measure_seqlen(settings, seqlen, oracle_budget_bytes, seed))
                free_cached_memory(settings.device)
    finally:
        torch.set_num_threads(previous_threads)
    print()
    _results_table(settings, rows)
    _growth_table(settings, rows)
    print(_verdict(rows))


__all__ = ["run_demo", "demo_settings", "DemoSettings", "DemoRow", "measure_seqlen"]
