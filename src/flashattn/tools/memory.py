"""Attention memory of a model, standard attention against flashattn, computed from its shapes.

Standard attention writes the N x N scores S = Q K^T and probabilities P = softmax(S) to memory, per
batch and query head, and in training keeps them for the backward: O(N^2) bytes per layer. flashattn
never writes them; it keeps one float32 log-sum-exp per query row, from which the backward recomputes
P block by block: O(N) bytes per layer. This module does that arithmetic for real model shapes
(``flashattn memory``), so that "how much does FlashAttention save for a 70B model at 4096 tokens?"
has an exact, itemized answer: for Llama-2-70B, batch 1, bfloat16, training, 320 GiB against 80 MiB.

Only the memory that attention itself adds is counted ("extra" memory): q, k and v are inputs both
implementations share, and the attention output, which both produce, is reported as a separate item.
The numbers are a model, not a measurement; ``flashattn memory --measure`` (``measure.py``) runs one
layer of the model and prints the measured peaks beside them, and ``flashattn demo`` measures the
same two quantities over a range of lengths.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .units import EXIT_USAGE, format_bytes, positive_float, positive_int, positive_int_list

KIB = 1024
MIB = 1024**2
GIB = 1024**3

# Bytes of one element. The log-sum-exp is float32 whatever the input dtype (it is an accumulator);
# a dropout mask is one byte per score (torch.bool).
DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}
DTYPE_ALIASES: dict[str, str] = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32"}
LSE_BYTES = 4
MASK_BYTES = 1

MODES = ("training", "inference")
DEFAULT_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)


class MemoryArgumentError(ValueError):
    """A bad argument to the calculator; ``argument`` names it, so the CLI can name the matching flag."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument
        self.detail = message


def _require_positive_int(argument: str, value: object) -> None:
    # bool is an int subclass: True would silently mean 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MemoryArgumentError(argument, f"must be a positive integer, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """The attention shapes of a decoder-only transformer: all the calculator needs of a model.

    ``kv_heads`` < ``heads`` is grouped-query attention (GQA). ``hidden`` (the model width) is carried
    for the record only: attention's sizes depend on heads x head_dim, which equals ``hidden`` for the
    Llama and Mistral families but not for every model.
    """

    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int

    def __post_init__(self) -> None:
        for argument in ("layers", "heads", "kv_heads", "head_dim", "hidden"):
            _require_positive_int(argument, getattr(self, argument))
        if self.heads % self.kv_heads:
            raise MemoryArgumentError(
                "kv_heads", f"must divide heads ({self.heads}) so that each kv head serves a whole group, "
                            f"got {self.kv_heads}")

    def describe(self) -> str:
        return (f"{self.name} ({self.layers} layers, {self.heads} heads, {self.kv_heads} kv heads, "
                f"head dim {self.head_dim})")


PRESETS: dict[str, ModelConfig] = {
    config.name.lower(): config
    for config in (
        ModelConfig("Llama-2-7B", layers=32, heads=32, kv_heads=32, head_dim=128, hidden=4096),
        ModelConfig("Llama-2-13B", layers=40, heads=40, kv_heads=40, head_dim=128, hidden=5120),
        ModelConfig("Llama-2-70B", layers=80, heads=64, kv_heads=8, head_dim=128, hidden=8192),
        ModelConfig("Llama-3-8B", layers=32, heads=32, kv_heads=8, head_dim=128, hidden=4096),
        ModelConfig("Llama-3-70B", layers=80, heads=64, kv_heads=8, head_dim=128, hidden=8192),
        ModelConfig("Mistral-7B", layers=32, heads=32, kv_heads=8, head_dim=128, hidden=4096),
    )
}


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``, ignoring case; an unknown name is an error that lists the known ones."""
    config = PRESETS.get(name.strip().lower())
    if config is None:
        raise MemoryArgumentError("model", f"unknown model {name!r}; known: {', '.join(PRESETS)}")
    return config


# ---------------------------------------------------------------------------------------------
# The calculation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Footprint:
    """What one implementation holds, itemized per layer, and how many layers' copies are alive at once."""

    per_layer_items: dict[str, int]  # item name -> bytes in one layer
    layers_alive: int

    @property
    def per_layer_bytes(self) -> int:
        return sum(self.per_layer_items.values())

    @property
    def total_bytes(self) -> int:
        return self.per_layer_bytes * self.layers_alive

    def to_json(self) -> dict:
        return {"per_layer_bytes": self.per_layer_bytes, "layers_alive": self.layers_alive,
                "total_bytes": self.total_bytes, "per_layer_items": dict(self.per_layer_items)}


@dataclass(frozen=True)
class AttentionMemory:
    """The answer for one (model, batch, seqlen, dtype, mode): extra memory of each implementation.

    ``standard`` and ``flashattn`` are the extra memory attention adds; ``output`` is the attention
    output, which both produce in full and which is therefore not part of either's extra memory.
    """

    config: ModelConfig
    batch: int
    seqlen: int
    dtype: str
    mode: str
    dropout: bool
    standard: Footprint
    flashattn: Footprint
    output: Footprint = field(repr=False)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def ratio(self) -> float:
        """Standard attention's total extra memory over flashattn's (the saving factor)."""
        return self.standard.total_bytes / self.flashattn.total_bytes

    @property
    def saved_bytes(self) -> int:
        return self.standard.total_bytes - self.flashattn.total_bytes


def canonical_dtype(dtype: str) -> str:
    """'bf16' -> 'bfloat16' etc.; anything but float16, bfloat16, float32 (or an alias) is an error."""
    name = DTYPE_ALIASES.get(str(dtype).strip().lower(), str(dtype).strip().lower())
    if name not in DTYPE_BYTES:
        raise MemoryArgumentError("dtype", f"must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return name


def attention_memory(
    config: ModelConfig,
    batch: int,
    seqlen: int,
    dtype: str = "bfloat16",
    mode: str = "training",
    dropout: bool = False,
) -> AttentionMemory:
    """Extra attention memory of standard attention and of flashattn, for self-attention over ``seqlen``.

    Standard attention (the FlashAttention paper's Algorithm 0) writes, per layer:

    - the scores S and the probabilities P, each ``batch * heads * seqlen^2 * dtype_bytes``;
    - with ``dropout`` (training only), the dropout mask, ``batch * heads * seqlen^2`` bytes (bool).

    flashattn writes, per layer, the float32 log-sum-exp of each query row, ``batch * heads * seqlen * 4``
    bytes (and, with dropout, a 16-byte Philox seed, not counted: no mask is stored, it is regenerated).

    How many layers' copies are alive at once depends on the mode:

    - ``training``: the backward of every layer needs what its forward saved (standard: S and P, and the
      mask; flashattn: the log-sum-exp), and at the start of the backward all layers' are still alive, so
      the total is ``layers x`` per layer. (Activation checkpointing would trade this for recomputation;
      it is not modelled.)
    - ``inference``: nothing is kept for a backward, so one layer's S and P are freed before the next
      layer runs and the total is one layer's. flashattn's forward holds only a tile of S and P in on-chip
      SRAM; the log-sum-exp it writes for that layer (which an inference caller may ignore) is reported.

    Eager autograd may keep less of standard attention's S than this model (softmax's backward needs only
    P), but P and the dropout mask alone are still O(N^2): the saving stays of the same order.
    """
    if not isinstance(config, ModelConfig):
        raise MemoryArgumentError("config", f"must be a ModelConfig, got {type(config).__name__}")
    _require_positive_int("batch", batch)
    _require_positive_int("seqlen", seqlen)
    dtype = canonical_dtype(dtype)
    if mode not in MODES:
        raise MemoryArgumentError("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(dropout, bool):
        raise MemoryArgumentError("dropout", f"must be True or False, got {dropout!r}")
    if dropout and mode != "training":
        raise MemoryArgumentError("dropout", "applies to training only (inference runs without dropout)")

    element = DTYPE_BYTES[dtype]
    # GQA does not shrink the scores: every query head scores every key, so S and P are per query head
    # (config.heads); kv_heads only shrinks K and V, which are inputs, not attention's extra memory.
    scores_per_layer = batch * config.heads * seqlen * seqlen
    standard_items = {
        "scores": scores_per_layer * element,
        "probabilities": scores_per_layer * element,
    }
    if dropout:
        standard_items["dropout_mask"] = scores_per_layer * MASK_BYTES
    flash_items = {"log_sum_exp": batch * config.heads * seqlen * LSE_BYTES}
    output_items = {"attention_output": batch * seqlen * config.heads * config.head_dim * element}

    layers_alive = config.layers if mode == "training" else 1
    return AttentionMemory(
        config=config, batch=batch, seqlen=seqlen, dtype=dtype, mode=mode, dropout=dropout,
        standard=Footprint(standard_items, layers_alive),
        flashattn=Footprint(flash_items, layers_alive),
        output=Footprint(output_items, layers_alive),
    )


def memory_table(
    config: ModelConfig,
    seqlens: Sequence[int],
    batch: int = 1,
    dtype: str = "bfloat16",
    mode: str = "training",
    dropout: bool = False,
) -> list[AttentionMemory]:
    """:func:`attention_memory` at each sequence length (one row of the table each)."""
    if not seqlens:
        raise MemoryArgumentError("seqlens", "needs at least one sequence length")
    return [attention_memory(config, batch, seqlen, dtype, mode, dropout) for seqlen in seqlens]


# ---------------------------------------------------------------------------------------------
# Rendering: text, JSON, plot
# ---------------------------------------------------------------------------------------------


def format_ratio(ratio: float) -> str:
    """4096x, or 1.25x when the ratio is not whole."""
    return f"{ratio:.0f}x" if ratio == int(ratio) else f"{ratio:.2f}x"


TABLE_HEADERS = ("seqlen", "standard per layer", "standard total", "flashattn per layer", "flashattn total",
                 "ratio")


def _settings_line(first: AttentionMemory) -> str:
    dropout = ", dropout" if first.dropout else ""
    return f"{first.config.describe()}, batch {first.batch}, {first.dtype}, {first.mode}{dropout}"


def _check_same_settings(results: Sequence[AttentionMemory]) -> AttentionMemory:
    """The first result, after checking that all of them differ in seqlen only (they share one header)."""
    if not results:
        raise MemoryArgumentError("results", "needs at least one result")
    first = results[0]
    settings = (first.config, first.batch, first.dtype, first.mode, first.dropout)
    for result in results[1:]:
        if (result.config, result.batch, result.dtype, result.mode, result.dropout) != settings:
            raise MemoryArgumentError("results", "must differ in seqlen only")
    return first


def render_table(results: Sequence[AttentionMemory], gpu_memory_bytes: int | None = None) -> str:
    """A plain-text table, one row per sequence length, with the notes needed to read it."""
    first = _check_same_settings(results)
    rows = [
        (str(result.seqlen), format_bytes(result.standard.per_layer_bytes), format_bytes(result.standard.total_bytes),
         format_bytes(result.flashattn.per_layer_bytes), format_bytes(result.flashattn.total_bytes),
         format_ratio(result.ratio))
        for result in results
    ]
    widths = [max(len(header), *(len(row[i]) for row in rows)) for i, header in enumerate(TABLE_HEADERS)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    standard_items = " + ".join(name.replace("_", " ") for name in first.standard.per_layer_items)
    if first.mode == "training":
        total_note = f"total = {first.config.layers} layers x per layer: training keeps every layer's for the backward"
    else:
        total_note = "total = one layer: in inference each layer's memory is freed before the next layer runs"
    per_token_output = first.output.per_layer_bytes // first.seqlen
    notes = [
        f"standard = {standard_items} (each batch x heads x seqlen^2); "
        f"flashattn = float32 log-sum-exp (batch x heads x seqlen)",
        total_note,
        f"not counted (both produce it): the attention output, {format_bytes(per_token_output)} per token per layer",
        "GQA does not change these: scores are per query head",
    ]
    if gpu_memory_bytes is not None:
        notes.append(_gpu_note(results, gpu_memory_bytes))
    lines = [f"Attention extra memory: {_settings_line(first)}", line(TABLE_HEADERS),
             line(["-" * width for width in widths]), *(line(row) for row in rows), *notes]
    return "\n".join(lines) + "\n"


def _gpu_note(results: Sequence[AttentionMemory], gpu_memory_bytes: int) -> str:
    """Which implementation's total outgrows the GPU, and from which listed seqlen."""

    def first_over(pick) -> str:
        # Reaching the GPU's memory already means not fitting: the weights and the rest need room too.
        over = [result.seqlen for result in results if pick(result).total_bytes >= gpu_memory_bytes]
        return f"from seqlen {min(over)}" if over else "at none of these seqlens"

    return (f"GPU memory {format_bytes(gpu_memory_bytes)}: standard attention alone fills it "
            f"{first_over(lambda r: r.standard)}, flashattn {first_over(lambda r: r.flashattn)}")


def to_json(results: Sequence[AttentionMemory], gpu_memory_bytes: int | None = None) -> dict:
    """A plain dict (json.dumps-able) of the settings and one entry per sequence length, bytes as ints."""
    first = _check_same_settings(results)
    config = first.config
    data: dict = {
        "model": {"name": config.name, "layers": config.layers, "heads": config.heads,
                  "kv_heads": config.kv_heads, "head_dim": config.head_dim, "hidden": config.hidden},
        "batch": first.batch,
        "dtype": first.dtype,
        "dtype_bytes": first.dtype_bytes,
        "mode": first.mode,
        "dropout": first.dropout,
        "rows": [
            {"seqlen": result.seqlen, "standard": result.standard.to_json(),
             "flashattn": result.flashattn.to_json(), "shared_output": result.output.to_json(),
             "ratio": result.ratio, "saved_bytes": result.saved_bytes}
            for result in results
        ],
    }
    if gpu_memory_bytes is not None:
        data["gpu_memory_bytes"] = gpu_memory_bytes
    return data


def _seqlen_label(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)


def _tick_bytes(count: float) -> str:
    """An axis label: like :func:`format_bytes`, without the decimals of a round value (32 GiB, not 32.0 GiB)."""
    number, unit = format_bytes(count).split()
    return f"{float(number):g} {unit}"


def plot_memory(
    config: ModelConfig,
    seqlens: Sequence[int],
    path: str | Path,
    gpu_memory_bytes: int | None = None,
    *,
    gpu_label: str | None = None,
    batch: int = 1,
    dtype: str = "bfloat16",
    mode: str = "training",
    dropout: bool = False,
) -> Path:
    """Save a PNG of total extra memory against seqlen, standard vs flashattn, on log-log axes.

    Log-log because the point is the slopes: 2 for standard attention (O(N^2)), 1 for flashattn (O(N)).
    A horizontal line marks the GPU's memory when given, to show where standard attention stops fitting.
    matplotlib is imported here, so that the calculator itself does not need it.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

    results = memory_table(config, sorted(set(seqlens)), batch, dtype, mode, dropout)
    xs = [result.seqlen for result in results]
    standard = [result.standard.total_bytes for result in results]
    flash = [result.flashattn.total_bytes for result in results]

    figure, axes = plt.subplots(figsize=(8, 5.5), layout="constrained")
    axes.plot(xs, standard, "o-", color="tab:red", label="standard attention (S + P" +
              (" + dropout mask" if dropout else "") + "): O(N²)")
    axes.plot(xs, flash, "s-", color="tab:blue", label="flashattn (log-sum-exp): O(N)")
    for x, y_standard, y_flash, result in zip(xs, standard, flash, results, strict=True):
        axes.annotate(format_bytes(y_standard), (x, y_standard), textcoords="offset points", xytext=(0, 8),
                      ha="center", fontsize=8, color="tab:red")
        axes.annotate(format_bytes(y_flash), (x, y_flash), textcoords="offset points", xytext=(0, -14),
                      ha="center", fontsize=8, color="tab:blue")
        # The saving factor on a dotted connector, halfway on the log scale; boxed, so that it stays
        # readable where it crosses the GPU line.
        axes.plot([x, x], [y_flash, y_standard], ":", color="gray", linewidth=0.8, zorder=1)
        axes.annotate(format_ratio(result.ratio), (x, (y_standard * y_flash) ** 0.5), ha="center", va="center",
                      fontsize=8, color="dimgray", zorder=3,
                      bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "lightgray"})
    if gpu_memory_bytes is not None:
        label = f"{gpu_label or 'GPU'} memory: {_tick_bytes(gpu_memory_bytes)}"
        axes.axhline(gpu_memory_bytes, color="black", linestyle="--", linewidth=1.2, label=label)

    axes.set_xscale("log", base=2)
    axes.set_yscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(xs))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _seqlen_label(int(round(value)))))
    axes.xaxis.set_minor_locator(NullLocator())
    # One major tick per factor of 32 keeps the labels round in binary units (1 MiB, 32 MiB, 1 GiB, ...).
    axes.yaxis.set_major_locator(LogLocator(base=32, numticks=20))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _tick_bytes(value)))
    axes.yaxis.set_minor_formatter(NullFormatter())
    low, high = min(flash), max(standard + ([gpu_memory_bytes] if gpu_memory_bytes else []))
    axes.set_ylim(low / 4, high * 4)
    axes.grid(True, which="major", alpha=0.3)

    axes.set_xlabel("sequence length N (tokens)")
    total = f"all {config.layers} layers" if mode == "training" else "one layer"
    axes.set_ylabel(f"extra attention memory, {total}")
    axes.set_title(f"Attention memory, {mode}: {config.name}\n"
                   f"batch {batch}, {canonical_dtype(dtype)}, {config.heads} query heads; "
                   f"boxes: standard / flashattn", fontsize=11)
    axes.legend(loc="upper left")
    path = Path(path)
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path


# ---------------------------------------------------------------------------------------------
# Command line: flashattn memory
# ---------------------------------------------------------------------------------------------

SHAPE_FLAGS = ("layers", "heads", "kv_heads", "head_dim", "hidden")
# Calculator argument -> the flag a user typed, for error messages.
FLAG_NAMES = {"seqlen": "--seqlens", "seqlens": "--seqlens", "model": "--model", "config": "--model"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model", "a preset, or the shapes of your own model")
    model.add_argument("--model", metavar="NAME", default=None,
                       help=f"a preset, case-insensitive: {', '.join(PRESETS)}")
    model.add_argument("--layers", type=positive_int, default=None, help="number of transformer layers")
    model.add_argument("--heads", type=positive_int, default=None, help="number of query heads")
    model.add_argument("--kv-heads", type=positive_int, default=None,
                       help="number of key/value heads (GQA; default: --heads)")
    model.add_argument("--head-dim", type=positive_int, default=None, help="head dimension")
    model.add_argument("--hidden", type=positive_int, default=None,
                       help="model width, for the record (default: heads x head dim)")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size (default: 1)")
    parser.add_argument("--seqlens", type=positive_int_list, nargs="+", default=None, metavar="N",
                        help="sequence lengths, space or comma separated "
                             f"(default: {' '.join(map(str, DEFAULT_SEQLENS))})")
    parser.add_argument("--dtype", choices=(*DTYPE_BYTES, *DTYPE_ALIASES), default="bfloat16",
                        help="element type of S, P and the output (default: bfloat16)")
    parser.add_argument("--mode", choices=MODES, default="training",
                        help="training keeps every layer's memory for the backward; inference one layer's "
                             "(default: training)")
    parser.add_argument("--dropout", action="store_true", help="training with dropout: count the dropout mask")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--plot", metavar="FILE.png", default=None,
                        help="also save a log-log plot of memory vs seqlen (needs matplotlib)")
    parser.add_argument("--gpu-memory-gb", type=positive_float, default=None, metavar="GB",
                        help="GPU memory to compare against, in GiB as GPU datasheets count it (80 for an "
                             "H100, 141 for an H200; default: the CUDA GPU's, if there is one)")
    parser.add_argument("--measure", nargs="?", const="cuda", choices=("cuda", "cpu"), default=None,
                        metavar="DEVICE",
                        help="instead of the table, measure one layer at each seqlen (standard attention and "
                             "flashattn, inference and training) and print it beside the model: peak memory "
                             "from the CUDA allocator; 'cpu' measures the CPU path with torch.profiler "
                             "(default device: cuda)")


def _usage_error(message: str) -> int:
    print(f"flashattn memory: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _flag(argument: str) -> str:
    return FLAG_NAMES.get(argument, "--" + argument.replace("_", "-"))


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    """The preset named by --model, or a config from the explicit shape flags (not both)."""
    given = [name for name in SHAPE_FLAGS if getattr(args, name) is not None]
    if args.model is not None:
        if given:
            raise MemoryArgumentError("model", f"give --model or the shape flags, not both "
                                               f"(got {', '.join(_flag(name) for name in given)})")
        return get_preset(args.model)
    missing = [name for name in ("layers", "heads", "head_dim") if getattr(args, name) is None]
    if missing:
        raise MemoryArgumentError("model", f"give --model NAME, or {', '.join(_flag(name) for name in missing)} "
                                           "(with --kv-heads and --hidden optional)")
    kv_heads = args.kv_heads if args.kv_heads is not None else args.heads
    hidden = args.hidden if args.hidden is not None else args.heads * args.head_dim
    return ModelConfig("custom", layers=args.layers, heads=args.heads, kv_heads=kv_heads,
                       head_dim=args.head_dim, hidden=hidden)


def detected_gpu() -> tuple[int, str] | None:
    """(total memory in bytes, name) of CUDA device 0, or None without torch or a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    return int(properties.total_memory), properties.name


def run(args: argparse.Namespace, measure=None) -> int:
    """``flashattn memory``: print the table (or JSON), optionally save the plot; 2 on a bad argument."""
    seqlens = list(DEFAULT_SEQLENS) if args.seqlens is None else [n for group in args.seqlens for n in group]
    try:
        config = config_from_args(args)
        results = memory_table(config, seqlens, args.batch, args.dtype, args.mode, args.dropout)
    except MemoryArgumentError as error:
        return _usage_error(f"{_flag(error.argument)}: {error.detail}")
    if args.measure is not None and args.dropout:
        return _usage_error("--dropout: not measured (the standard attention measured has no dropout); "
                            "drop --dropout or --measure")

    if args.gpu_memory_gb is not None:
        gpu_memory_bytes, gpu_label = int(args.gpu_memory_gb * GIB), None
    else:
        gpu = detected_gpu()
        gpu_memory_bytes, gpu_label = gpu if gpu is not None else (None, None)

    if args.measure is not None:
        if measure is None:
            return _usage_error("--measure: run it through `flashattn memory` (flashattn.tools.measure.run)")
        status = measure(config, seqlens, args)
        if status:
            return status
    elif args.json:
        print(json.dumps(to_json(results, gpu_memory_bytes), indent=2))
    else:
        print(render_table(results, gpu_memory_bytes).rstrip("\n"))

    if args.plot is not None:
        try:
            written = plot_memory(config, seqlens, args.plot, gpu_memory_bytes, gpu_label=gpu_label,
                                  batch=args.batch, dtype=args.dtype, mode=args.mode, dropout=args.dropout)
        except ImportError:
            return _usage_error("--plot: needs matplotlib (pip install matplotlib)")
        except OSError as error:
            return _usage_error(f"--plot: cannot write {args.plot!r}: {error.strerror or error}")
        print(f"plot written to {written}", file=sys.stderr)  # stderr: keeps --json's stdout parseable
    return 0
