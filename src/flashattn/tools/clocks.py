"""The GPU's SM clock and board power while a benchmark runs, sampled by ``nvidia-smi`` in the background.

On the H200 the heavy kernels run the board at its power limit, and the driver then lowers the SM clock (1680-1980
MHz within one short run), so a cell's time depends on the clock it ran at, which a
long grid's later cells see lower. ``flashattn bench`` records, for each timing, the median clock and the highest
power sampled while it ran.

One ``nvidia-smi`` process samples for the whole run (a process per timing would cost a fraction of a second each);
a thread reads its lines with their arrival times, and :meth:`ClockMonitor.window` summarizes the samples between
two ``time.monotonic()`` stamps. Without ``nvidia-smi`` or off the GPU nothing is sampled and every window is empty.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time

import torch

SAMPLE_MS = 100


def parse_sample(line: str) -> tuple[float, float] | None:
    """(SM clock MHz, power W) from one ``--format=csv,noheader,nounits`` line of clocks.sm,power.draw, or None
    (a header, "[N/A]", a blank line)."""
    parts = [part.strip() for part in line.split(",")]
    if len(parts) != 2:
        return None
    try:
        return float(parts[0]), float(parts[1])
    except ValueError:
        return None


def _nvidia_smi_id(device: torch.device) -> str:
    """The device as nvidia-smi names it: its index, or its UUID where CUDA_VISIBLE_DEVICES renumbers devices."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        return str(index)
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


class ClockMonitor:
    """Samples the SM clock and board power of ``device`` every SAMPLE_MS while in its ``with`` block."""

    def __init__(self, device: torch.device):
        self.device = device
        self.samples: list[tuple[float, float, float]] = []  # (monotonic seconds, MHz, W)
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ClockMonitor:
        if self.device.type != "cuda" or shutil.which("nvidia-smi") is None:
            return self
        try:
            self._process = subprocess.Popen(
                ["nvidia-smi", f"--id={_nvidia_smi_id(self.device)}", "--query-gpu=clocks.sm,power.draw",
                 "--format=csv,noheader,nounits", f"--loop-ms={SAMPLE_MS}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self.samples.append((time.monotonic(), *sample))

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=5)
            self._reader.join(timeout=5)
            self._process = None

    def window(self, start: float, end: float) -> tuple[float | None, float | None]:
        """(median SM clock MHz, highest power W) of the samples taken between two monotonic stamps; (None, None)
        when none was."""
        inside = [(mhz, watts) for stamp, mhz, watts in list(self.samples) if start <= stamp <= end]
        if not inside:
            return None, None
        return statistics.median(mhz for mhz, _ in inside), max(watts for _, watts in inside)
