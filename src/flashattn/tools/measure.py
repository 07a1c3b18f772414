"""Run one attention layer for real and observe it: ``flashattn memory --measure`` lives here, and the
inputs and passes that ``flashattn io --measure`` (``iomeasure.py``) times and profiles.

``memory.py`` and ``iomodel.py`` are models: they count what standard attention and flashattn must
hold and move. This module runs both on a device and reads what they actually allocate. Standard
attention is ``bench``'s ``naive`` provider (S = Q K^T and P = softmax(S) materialized in the input
dtype, the FlashAttention paper's Algorithm 0); flashattn is ``flash_attn_func``.

**Memory.** On a CUDA device the caching allocator's counters (``reset_peak_memory_stats``,
``max_memory_allocated``) give what a call had allocated at its peak and what it left allocated, above
what was allocated before it (the inputs). On the CPU torch keeps no such counters, but
``torch.profiler`` with ``profile_memory=True`` records every allocation and free, whose running sum
gives the same two numbers (``demo.allocation_window``). Both count bytes handed out to tensors, not
what an allocator reserved.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from .. import backend, cpu
from . import memory
from .demo import allocation_window, free_cached_memory, is_out_of_memory
from .memory import ModelConfig, attention_memory, canonical_dtype
from .units import EXIT_USAGE, format_bytes

IMPLEMENTATIONS = ("standard", "flashattn")
DIRECTIONS = ("forward", "backward")
# bench's provider that implements each
_PROVIDERS = {"standard": "naive", "flashattn": "flashattn"}
# A CPU allocation that fails is not reliably recoverable (the OS may kill the process first), so the
# CPU measurement refuses shapes whose standard attention would need more than this.
CPU_MEASURE_LIMIT_BYTES = 2 * 1024**3


class DeviceUnavailable(RuntimeError):
    """The measurement cannot run here (no CUDA GPU, or a shape too large for the CPU): a usage error."""


# ---------------------------------------------------------------------------------------------
# One layer's inputs and the two implementations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerShape:
    """One attention call, (batch, seqlen, heads, head_dim) layout; ``dtype`` is a torch dtype name."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    causal: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass
class LayerInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor  # the output's gradient, for the backward


def make_inputs(shape: LayerShape, device: torch.device, requires_grad: bool, seed: int = 0) -> LayerInputs:
    """Random q, k, v (and dout) of ``shape`` on ``device``."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(heads: int, seqlen: int) -> torch.Tensor:
        return torch.randn((shape.batch, seqlen, heads, shape.head_dim), device=device, dtype=shape.torch_dtype,
                           generator=generator)

    q, k, v = randn(shape.heads, shape.seqlen_q), randn(shape.kv_heads, shape.seqlen_k), randn(
        shape.kv_heads, shape.seqlen_k)
    for x in (q, k, v):
        x.requires_grad_(requires_grad)
    return LayerInputs(q, k, v, randn(shape.heads, shape.seqlen_q))


def attention_runner(implementation: str, inputs: LayerInputs, causal: bool) -> Callable[[], torch.Tensor]:
    """A zero-argument callable that runs the forward of ``implementation`` on ``inputs``."""
    from .bench import PROVIDERS

    if implementation not in _PROVIDERS:
        raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
    return PROVIDERS[_PROVIDERS[implementation]](inputs.q, inputs.k, inputs.v, causal)


def gradients(out: torch.Tensor, inputs: LayerInputs, retain_graph: bool = False) -> tuple[torch.Tensor, ...]:
    """The backward of one call: dq, dk, dv for the output gradient ``inputs.dout``."""
    return torch.autograd.grad(out, (inputs.q, inputs.k, inputs.v), inputs.dout, retain_graph=retain_graph)


def measurement_device(name: str) -> torch.device:
    """'cuda' or 'cpu' as a device; DeviceUnavailable when CUDA is asked for and there is none."""
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("needs a CUDA GPU, and torch sees none")
    return torch.device(name)


def device_label(device: torch.device) -> str:
    """The GPU's name, or 'cpu', with the backend flashattn runs there."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{name} (flashattn: {backend.description(device.type)})"


def _storage_bytes(x: torch.Tensor) -> int:
    """Bytes of the memory under x (a transposed view counts its whole, contiguous storage)."""
    return x.untyped_storage().nbytes()


# ---------------------------------------------------------------------------------------------
# flashattn memory --measure
# ---------------------------------------------------------------------------------------------


@dataclass
class MemoryCell:
    """One implementation in one mode at one seqlen: the model's bytes and the measured ones.

    ``measured_bytes``: inference, the peak allocated during the forward above the inputs, less the
    output; training, what the forward leaves allocated for the backward, less the output.
    ``peak_bytes`` (training only): the peak over forward and backward above the inputs, less the
    output and the gradients. ``out_of_memory`` names the pass that ran out of memory, if one did.
    """

    seqlen: int
    mode: str
    implementation: str
    model_bytes: int
    measured_bytes: int | None = None
    peak_bytes: int | None = None
    out_of_memory: str | None = None

    @property
    def ratio(self) -> float | None:
        """Measured over model (None when out of memory)."""
        if self.measured_bytes is None or not self.model_bytes:
            return None
        return self.measured_bytes / self.model_bytes


def _measure_inference(shape: LayerShape, implementation: str, device: torch.device, cell: MemoryCell) -> None:
    inputs = make_inputs(shape, device, requires_grad=False)
    run = attention_runner(implementation, inputs, shape.causal)
    kept: dict[str, torch.Tensor] = {}

    def forward() -> None:
        kept["out"] = run()

    try:
        with torch.no_grad():
            window = allocation_window(forward, device)
    except RuntimeError as error:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if not is_out_of_memory(error):
            raise
        cell.out_of_memory = "forward"
        return
    cell.measured_bytes = window.peak - _storage_bytes(kept["out"])


def _measure_training(shape: LayerShape, implementation: str, device: torch.device, cell: MemoryCell) -> None:
    inputs = make_inputs(shape, device, requires_grad=True)
    run = attention_runner(implementation, inputs, shape.causal)
    kept: dict[str, object] = {}

    def forward() -> None:
        kept["out"] = run()

    def backward() -> None:
        kept["grads"] = gradients(kept["out"], inputs)

    try:
        after_forward = allocation_window(forward, device)
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        cell.out_of_memory = "forward"
        return
    output_bytes = _storage_bytes(kept["out"])
    cell.measured_bytes = after_forward.end - output_bytes
    try:
        after_backward = allocation_window(backward, device)
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        cell.out_of_memory = "backward"
        return
    # The backward's window starts where the forward's ended, so its peak sits on top of that.
    peak = max(after_forward.peak, after_forward.end + after_backward.peak)
    cell.peak_bytes = peak - output_bytes - sum(_storage_bytes(g) for g in kept["grads"])


WARM_UP_SEQLEN = 128


def warm_up(config: ModelConfig, dtype: str, device: torch.device) -> None:
    """One small forward and backward of each implementation, unmeasured, so that what a first call
    allocates once for the whole process (cuBLAS's workspace, kept after the call; Triton's compiled
    kernels) is not counted against the first measured cell."""
    shape = LayerShape(1, WARM_UP_SEQLEN, WARM_UP_SEQLEN, config.heads, config.kv_heads, config.head_dim, dtype)
    for implementation in IMPLEMENTATIONS:
        inputs = make_inputs(shape, device, requires_grad=True)
        gradients(attention_runner(implementation, inputs, shape.causal)(), inputs)
    free_cached_memory(device)


def measure_layer_memory(config: ModelConfig, batch: int, seqlen: int, dtype: str,
                         device: torch.device) -> list[MemoryCell]:
    """Measure one layer of ``config`` (non-causal self-attention over ``seqlen``): both implementations,
    inference and training, next to the model of ``memory.attention_memory``. An out-of-memory error is
    a result, reported in its cell."""
    shape = LayerShape(batch, seqlen, seqlen, config.heads, config.kv_heads, config.head_dim, dtype)
    cells = []
    for mode in ("inference", "training"):
        measure = _measure_inference if mode == "inference" else _measure_training
        for implementation in IMPLEMENTATIONS:
            model = getattr(attention_memory(config, batch, seqlen, dtype, mode), implementation)
            cell = MemoryCell(seqlen, mode, implementation, model.per_layer_bytes)
            try:
                measure(shape, implementation, device, cell)
            finally:
                free_cached_memory(device)  # an OOM leaves the cache fragmented for the next cell
            cells.append(cell)
    return cells


def check_cpu_budget(config: ModelConfig, batch: int, seqlens: Sequence[int], dtype: str) -> None:
    """DeviceUnavailable when standard attention at some seqlen would exceed the CPU's budget."""
    for seqlen in seqlens:
        needed = attention_memory(config, batch, seqlen, dtype, "inference").standard.per_layer_bytes
        if needed > CPU_MEASURE_LIMIT_BYTES:
            raise DeviceUnavailable(
                f"seqlen {seqlen} needs {format_bytes(needed)} for standard attention's S and P, over the "
                f"{format_bytes(CPU_MEASURE_LIMIT_BYTES)} the CPU measurement allows (a failed CPU allocation "
                "may kill the process rather than raise): give smaller --seqlens, or measure on a GPU")


def memory_notes(config: ModelConfig, device: torch.device, batch: int = 1) -> list[str]:
    notes = [
        "model: `flashattn memory`'s extra memory of one layer: standard = S + P, flashattn = float32 "
        "log-sum-exp",
        "measured, inference: peak allocated during the forward above the inputs, less the output",
        "measured, training: what the forward leaves allocated for the backward, less the output",
        "peak fwd+bwd: peak over forward and backward above the inputs, less the output and the gradients: "
        "what is saved plus the backward's scratch (standard: dP and dS, N x N each; flashattn: the delta rows, "
        "and where the backward fuses dQ (sm90, non-deterministic, head dims 64 and 128) dQ in float32)",
        "standard training measures about half of its model: eager autograd keeps P for the backward and frees "
        "S (softmax's backward needs only its output); the model counts both, as the seeds do",
    ]
    if config.kv_heads != config.heads:
        notes.append("GQA: standard attention also copies K and V once per query head (O(N d), not in the model)")
    if device.type == "cpu":
        rows = cpu.block_m(batch, config.heads)
        tile = batch * config.heads * rows * cpu.BLOCK_N * 4
        notes += [
            "cpu: allocations from torch.profiler's memory events; flashattn runs its blocked PyTorch path (the "
            "model describes the GPU kernels, whose tiles stay on chip)",
            f"cpu: flashattn's measured memory adds the path's working set, a few float32 tiles of {rows} queries "
            f"((batch, heads, {rows}, {cpu.BLOCK_N}) scores, {format_bytes(tile)} each, and (batch, heads, {rows}, "
            "head dim) rows): it grows with seqlen up to that many queries and is constant beyond, so it dominates "
            "at short lengths (where it can exceed standard attention's S and P) and fades behind them at long "
            "ones; the backward also accumulates dq in float32 (q's size) when q is 16-bit",
        ]
    return notes


def _measured_text(cell: MemoryCell) -> str:
    if cell.measured_bytes is not None:
        return format_bytes(cell.measured_bytes)
    return "OOM" if cell.out_of_memory else "-"


def _peak_text(cell: MemoryCell) -> str:
    if cell.mode != "training":
        return "-"  # the inference column already is the forward's peak
    if cell.peak_bytes is not None:
        return format_bytes(cell.peak_bytes)
    return "OOM" if cell.out_of_memory else "-"


def render_memory_table(config: ModelConfig, batch: int, dtype: str, device: str, cells: Sequence[MemoryCell],
                        notes: Sequence[str]) -> str:
    headers = ("seqlen", "mode", "implementation", "model", "measured", "measured/model", "peak fwd+bwd")
    rows = []
    for cell in cells:
        ratio = cell.ratio
        rows.append((
            str(cell.seqlen), cell.mode, cell.implementation, format_bytes(cell.model_bytes),
            _measured_text(cell),
            "-" if ratio is None else f"{ratio:.2f}x" if ratio < 100 else f"{ratio:.0f}x",
            _peak_text(cell),
        ))
    widths = [max(len(header), *(len(row[i]) for row in rows)) for i, header in enumerate(headers)]

    def line(cells_: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells_, widths, strict=True))).rstrip()

    title = (f"Attention memory of one layer, model against measurement on {device}: {config.describe()}, "
             f"batch {batch}, {canonical_dtype(dtype)}")
    return "\n".join([title, line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows),
                      *(f"note: {n}" for n in notes)]) + "\n"


def memory_to_json(config: ModelConfig, batch: int, dtype: str, device: str, cells: Sequence[MemoryCell],
                   notes: Sequence[str]) -> dict:
    return {
        "model": {"name": config.name, "layers": config.layers, "heads": config.heads, "kv_heads": config.kv_heads,
                  "head_dim": config.head_dim, "hidden": config.hidden},
        "batch": batch,
        "dtype": canonical_dtype(dtype),
        "device": device,
        "measured": [{**asdict(cell), "ratio": cell.ratio} for cell in cells],
        "notes": list(notes),
    }


def run_memory_measure(config: ModelConfig, seqlens: Sequence[int], args: argparse.Namespace) -> int:
    """``flashattn memory --measure [DEVICE]``: the table (or JSON) of model against measurement."""
    try:
        device = measurement_device(args.measure)
        if device.type == "cpu":
            check_cpu_budget(config, args.batch, seqlens, args.dtype)
    except DeviceUnavailable as error:
        hint = (" (--measure cpu measures the CPU path with torch.profiler instead)"
                if args.measure == "cuda" else "")
        print(f"flashattn memory: error: argument --measure: {error}{hint}", file=sys.stderr)
        return EXIT_USAGE
    label = device_label(device)
    print(f"flashattn memory: measuring on {label}", file=sys.stderr, flush=True)
    warm_up(config, args.dtype, device)
    cells: list[MemoryCell] = []
    for seqlen in seqlens:
        cells += measure_layer_memory(config, args.batch, seqlen, args.dtype, device)
    notes = memory_notes(config, device, args.batch)
    if args.json:
        print(json.dumps(memory_to_json(config, args.batch, args.dtype, label, cells, notes), indent=2))
    else:
        print(render_memory_table(config, args.batch, args.dtype, label, cells, notes).rstrip("\n"))
    return 0


add_arguments = memory.add_arguments


def run(args: argparse.Namespace) -> int:
    """``flashattn memory``: the model's table, and with ``--measure`` one layer run for real beside it."""
    return memory.run(args, measure=run_memory_measure)
