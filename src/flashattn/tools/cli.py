"""The ``flashattn`` command line: ``flashattn demo``, ``flashattn info`` (and ``flashattn bench`` where
the ``flashattn.bench`` module is installed).

Subcommands live in a registry of name -> :class:`Subcommand` so that a new one is one entry: a
function that adds its options to an argparse subparser, and a function that runs it on the parsed
arguments and returns the exit code. Heavy imports happen inside the run functions, so ``--help``
and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .units import EXIT_USAGE, positive_int, positive_int_list


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: a one-line help, how to declare its options, and how to run it (-> exit code)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


# ---------------------------------------------------------------------------------------------
# Argument types
# ---------------------------------------------------------------------------------------------


def device_name(text: str) -> str:
    """An argparse type: a device torch can parse ('cpu', 'cuda', 'cuda:1'); availability is checked later."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a device: {text!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected 'cpu' or 'cuda[:index]', got {text!r}")
    return text


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=device_name, default=None,
                        help="cpu or cuda (default: cuda if available, else cpu)")
    parser.add_argument("--seqlens", type=positive_int_list, nargs="+", default=None, metavar="N",
                        help="sequence lengths, space or comma separated "
                             "(default: 256 512 1024 2048 on cpu, 1024 .. 16384 on cuda)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "fp32", "fp16", "bf16"),
                        default=None, help="default: float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--headdim", type=positive_int, default=None, help="default: 64 on cpu, 128 on cuda")
    parser.add_argument("--batch", type=positive_int, default=None, help="default: 1 on cpu, 2 on cuda")
    parser.add_argument("--heads", type=positive_int, default=None, help="default: 8 on cpu, 16 on cuda")
    parser.add_argument("--causal", action="store_true", help="use the causal mask")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads for the run "
                             "(default: torch's; fewer is steadier on a busy machine)")


def run_demo_command(args: argparse.Namespace) -> int:
    from .demo import run_demo

    seqlens = None if args.seqlens is None else [n for group in args.seqlens for n in group]
    try:
        run_demo(device=args.device, seqlens=seqlens, dtype=args.dtype, batch=args.batch, heads=args.heads,
                 headdim=args.headdim, causal=args.causal, threads=args.threads)
    except ValueError as error:  # e.g. --device cuda without a GPU, or a head dim flashattn refuses
        print(f"flashattn demo: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return 0


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the same fields as a JSON object")


def triton_version() -> str:
    """The installed triton's version, or 'not installed' (e.g. on macOS, or a CPU-only install)."""
    try:
        import triton
    except ImportError:
        return "not installed"
    return getattr(triton, "__version__", "unknown version")


def run_info_command(args: argparse.Namespace) -> int:
    import torch

    from .. import __version__, backend

    if torch.cuda.is_available():
        device_type = "cuda"
        device = f"cuda ({torch.cuda.get_device_name()}, {torch.cuda.device_count()} GPU(s))"
    else:
        device_type = "cpu"
        device = f"cpu ({torch.get_num_threads()} threads; no CUDA GPU visible)"
    try:
        runs = backend.description(device_type)
    except ValueError as error:
        print(f"flashattn info: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    cuda = torch.version.cuda or "none"
    lines = [
        ("flashattn", __version__),
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (CUDA {cuda})"),
        ("triton", triton_version()),
        ("device", device),
        ("backend", runs),
    ]
    if os.environ.get("FLASHATTN_BACKEND"):
        lines.append(("FLASHATTN_BACKEND", os.environ["FLASHATTN_BACKEND"]))
    if args.json:
        import json

        print(json.dumps(dict(lines), indent=2))
        return 0
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"{name.ljust(width)}  {value}")
    return 0


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------


def builtin_subcommands() -> dict[str, Subcommand]:
    return {
        "demo": Subcommand("compare flashattn with standard attention: error, time, memory",
                           add_demo_arguments, run_demo_command),
        "info": Subcommand("print versions, the device and the backend that would run",
                           add_info_arguments, run_info_command),
    }


# subcommand -> the module that holds its ``add_arguments(parser)`` and ``run(args)``
# (memory and io: the modules that add --measure to the models)
MODULE_SUBCOMMANDS = {"bench": "bench", "memory": "measure", "io": "iomeasure", "blocks": "blocks",
                     "ring": "bench_ring"}


def optional_subcommands() -> dict[str, Subcommand]:
    """Subcommands that live in a module of their own: registered only when it imports and has the two
    hooks ``add_arguments(parser)`` and ``run(args)``, so that the CLI works without (or before) them."""
    found: dict[str, Subcommand] = {}
    for name, module in MODULE_SUBCOMMANDS.items():
        module_name = f"{__package__}.{module}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:
                continue  # not written (or not installed): no such subcommand
            found[name] = _unavailable_subcommand(name, error)
            continue
        except ImportError as error:
            found[name] = _unavailable_subcommand(name, error)
            continue
        add_arguments, run = getattr(module, "add_arguments", None), getattr(module, "run", None)
        if not (callable(add_arguments) and callable(run)):
            continue
        summary = (module.__doc__ or name).strip().splitlines()[0]
        found[name] = Subcommand(summary, add_arguments, run)
    return found


def _unavailable_subcommand(name: str, error: ImportError) -> Subcommand:
    """The module is there but cannot be imported (typically an optional dependency is missing): keep
    the subcommand visible and say why it cannot run, rather than answer 'invalid choice'."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("ignored", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(args: argparse.Namespace) -> int:
        print(f"flashattn {name}: unavailable: {error}", file=sys.stderr)
        return 1

    return Subcommand(f"(unavailable: {error})", add_arguments, run)


def all_subcommands() -> dict[str, Subcommand]:
    return {**builtin_subcommands(), **optional_subcommands()}


def build_parser(subcommands: dict[str, Subcommand] | None = None) -> argparse.ArgumentParser:
    from .. import __version__

    subcommands = all_subcommands() if subcommands is None else subcommands
    parser = argparse.ArgumentParser(prog="flashattn", description="FlashAttention in pure Python.")
    parser.add_argument("--version", action="version", version=f"flashattn {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, subcommand in subcommands.items():
        subparser = subparsers.add_parser(name, help=subcommand.help, description=subcommand.help)
        subcommand.add_arguments(subparser)
        subparser.set_defaults(run_subcommand=subcommand.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse argv (default: sys.argv[1:]) and run the subcommand; returns the exit status."""
    args = build_parser().parse_args(argv)
    status = args.run_subcommand(args)
    return 0 if status is None else int(status)
