"""How the tools time a call: one helper for ``demo``, ``bench`` (its decode mode too) and ``blocks``, so that
they measure the same way and tell the same story.

A time is a :class:`Timing`: the median of repeated runs, with their spread and whether it settled.

- **CPU**: torch.utils.benchmark's ``Timer.adaptive_autorange``. After a warm-up, runs (each of enough calls
  that the timer's overhead does not count) repeat until their interquartile range is within
  ``SPREAD_THRESHOLD`` of their median, or until ``CPU_MAX_RUN_SECONDS`` of runs; the spread is that
  range over the median. The call runs with torch's current thread count (the Timer's own default is one
  thread). On a machine whose cores are busy with other work the spread shows it, and the time is marked
  unsettled rather than passed off as a measurement.
- **CUDA**: triton's ``do_bench`` (CUDA events, the L2 cache flushed between calls) in rounds until two
  consecutive rounds' medians agree within ``SETTLED_TOLERANCE`` (:func:`settle`); the spread is the gap
  between those two rounds. Without triton, CUDA events around single calls.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Two timing rounds on a GPU agree when their medians differ by at most this fraction (see settle).
SETTLED_TOLERANCE = 0.02
# Runs settle when their interquartile range is at most this fraction of their median (CPU, CUDA events) ...
SPREAD_THRESHOLD = 0.1
# ... or stop unsettled on the CPU when they have taken this many seconds.
CPU_MAX_RUN_SECONDS = 5.0


@dataclass(frozen=True)
class Timing:
    """The median seconds per call, the runs' relative spread, how many runs, and whether they settled."""

    seconds: float
    spread: float  # CPU: interquartile range / median of the runs; CUDA: the agreeing rounds' gap / the faster
    runs: int
    settled: bool

    def describe(self) -> str:
        """'6.89 ms ±5%', with ' unsettled' when the spread never came within the threshold."""
        text = f"{format_seconds(self.seconds)} ±{self.spread:.0%}"
        return text if self.settled else f"{text} unsettled"


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device) -> Timing:
    """Time ``fn`` on ``device`` as the module docstring says (a warm-up call first)."""
    if device.type == "cuda":
        return _time_cuda(fn, device)
    return _time_cpu(fn)


def median_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """The median of :func:`time_call`, for callers that keep only the time."""
    return time_call(fn, device).seconds


def _time_cpu(fn: Callable[[], object]) -> Timing:
    from torch.utils.benchmark import Timer

    fn()  # warm-up: first-call costs (allocations, lazy imports) are not the steady state
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    measurement = timer.adaptive_autorange(threshold=SPREAD_THRESHOLD, max_run_time=CPU_MAX_RUN_SECONDS)
    spread = measurement.iqr / measurement.median if measurement.median > 0 else 0.0
    return Timing(measurement.median, spread, len(measurement.times), spread <= SPREAD_THRESHOLD)


def _time_cuda(fn: Callable[[], object], device: torch.device) -> Timing:
    try:
        from triton.testing import do_bench
    except ImportError:
        return _time_cuda_events(fn, device)
    # 250 ms of warm-up before the first round, not do_bench's usual 25: right after a compile
    # (seconds with the GPU idle) the first case of a group measured at half speed on an H200
    # (hdim-128 causal 512: 103 against 215 TFLOP/s in a later sweep of the same config)
    return settle(lambda round_index: do_bench(fn, warmup=250 if round_index == 0 else 25, rep=100,
                                               return_mode="median") / 1e3)


def time_loop(fn: Callable[[], object], device: torch.device, calls: int = 200) -> Timing:
    """Seconds per call of ``fn`` called ``calls`` times back to back, by the wall clock from a synchronized start to a
    synchronized end, in rounds until two agree (:func:`settle`): where the host takes longer per call than the device,
    the host's time, as a loop that calls a short kernel eagerly sees it."""
    for _ in range(10):
        fn()

    def measure_round(_: int) -> float:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        return (time.perf_counter() - start) / calls

    return settle(measure_round)


def settle(measure_round: Callable[[int], float], max_rounds: int = 5,
           tolerance: float = SETTLED_TOLERANCE) -> Timing:
    """The faster of the first two consecutive rounds whose medians agree within ``tolerance``.

    ``measure_round(i)`` returns round i's median. Short cases (hundreds of microseconds) moved by up to a
    third between rounds on an H200 (hdim-128 causal 512: 142.5 and 187.9 TFLOP/s for one config in one
    sweep), so a single round is not a measurement. Without agreement after ``max_rounds`` rounds, the
    median of the rounds' medians, unsettled, its spread the rounds' range over it.
    """
    medians = [measure_round(0)]
    while len(medians) < max_rounds:
        medians.append(measure_round(len(medians)))
        previous, latest = medians[-2:]
        faster = min(previous, latest)
        if abs(latest - previous) <= tolerance * faster:
            return Timing(faster, abs(latest - previous) / faster if faster else 0.0, len(medians), True)
    middle = statistics.median(medians)
    spread = (max(medians) - min(medians)) / middle if middle else 0.0
    return Timing(middle, spread, len(medians), False)


def settled_median(measure_round: Callable[[int], float], max_rounds: int = 5,
                   tolerance: float = SETTLED_TOLERANCE) -> float:
    """The seconds of :func:`settle`."""
    return settle(measure_round, max_rounds, tolerance).seconds


def _time_cuda_events(fn: Callable[[], object], device: torch.device, repeats: int = 10) -> Timing:
    fn()
    synchronize(device)
    timings = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        timings.append(start.elapsed_time(end) / 1e3)
    middle = statistics.median(timings)
    quartiles = statistics.quantiles(timings, n=4)
    spread = (quartiles[2] - quartiles[0]) / middle if middle else 0.0
    return Timing(middle, spread, repeats, spread <= SPREAD_THRESHOLD)


__all__ = ["Timing", "time_call", "time_loop", "median_seconds", "settle", "settled_median", "format_seconds"]
