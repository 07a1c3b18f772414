"""Small shared helpers of the commands: byte formatting and argparse value types."""

from __future__ import annotations

import argparse
import math


def format_bytes(count: float | None) -> str:
    """Binary units with three significant digits: 1.00 MiB, 80.0 MiB, 320 GiB, 20.0 TiB ('-' for None)."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    if abs(value) >= 100:
        return f"{value:.0f} {unit}"
    return f"{value:.1f} {unit}" if abs(value) >= 10 else f"{value:.2f} {unit}"


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1, so that a typo is a usage error (exit 2), not a traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


EXIT_USAGE = 2  # argparse's exit status for bad arguments; the commands' run functions use it for bad values too


def positive_int_list(text: str) -> list[int]:
    """An argparse type for ``--seqlens 256 512`` and ``--seqlens 256,512`` alike."""
    return [positive_int(part) for part in text.split(",") if part.strip()] or [positive_int(text)]
