"""Measure the HBM traffic of standard attention and of flashattn on this GPU (``flashattn io --measure``).

Two ways, the first that works:

1. **Nsight Compute** (``ncu``, found on PATH or in /usr/local/cuda/bin), one run per pass. ncu starts
   a child process (``python -m flashattn.tools.iomeasure --child SPEC --pass IMPLEMENTATION:DIRECTION``)
   with profiling off (``--profile-from-start off``). The child warms the implementation up (a forward
   and a backward, unprofiled: the Triton kernels compile, cuBLAS picks its algorithms), then calls
   ``torch.cuda.profiler.start()`` right before the measured call and ``torch.cuda.synchronize();
   torch.cuda.profiler.stop()`` after it. cudaProfilerStart/Stop act on the whole process, so the
   kernels that autograd launches from its own device thread during the backward are profiled too
   (an NVTX push/pop range, being per thread, missed them). ncu reads two DRAM counters of every
   kernel in between, ``dram__bytes_read.sum`` and ``dram__bytes_write.sum``, and their sum over the
   run is the pass's traffic. ncu flushes the caches before every kernel it profiles (its default
   ``--cache-control all``), so each count is one kernel's traffic from a cold L2: the quantity the IO
   model brackets, kernel by kernel, between "no reuse across programs" and "L2 kept every tile".
2. **torch.profiler**, when there is no ncu, ncu may not read the counters (ERR_NVGPUCTRPERM: the
   driver restricts them to administrators unless loaded with NVreg_RestrictProfilingToAdminUsers=0),
   or an ncu run fails. It gives kernel durations only, so what is reported is the *implied*
   bandwidth, the model's bytes over the measured time: clearly not a byte measurement. An implied
   bandwidth above the GPU's real one means the no-reuse model overcounts (L2 served some of the
   re-read tiles).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import iomodel
from .iomodel import (
    GPU_PRESETS,
    IoReport,
    PassReport,
    Tiling,
    analyze,
    block_shape,
    format_bytes,
    format_report,
    format_seconds,
    gpu_from_args,
)

NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
IMPLEMENTATIONS = ("standard", "flashattn")
DIRECTIONS = ("forward", "backward")
# Forwards first: when an implementation's forward runs out of memory, its backward is not tried.
PHASES = tuple((implementation, direction) for direction in DIRECTIONS for implementation in IMPLEMENTATIONS)
PROFILER_REPEATS = 5  # calls per pass averaged by the torch.profiler fallback
NCU_TIMEOUT_SECONDS = 300  # per ncu run (one pass)
# ncu prints sizes in SI units (233.47 Kbyte is Hopper's 228 KiB of shared memory); the binary
# spellings are accepted too, in case a version prints them.
BYTE_UNITS = {
    "byte": 1, "kbyte": 10**3, "mbyte": 10**6, "gbyte": 10**9, "tbyte": 10**12,
    "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30, "tibyte": 2**40,
}
# Which kernel of the IO model a flashattn kernel is, by a word in its name (kernels/forward.py,
# kernels/backward.py); checked in this order.
FLASHATTN_KERNEL_WORDS = ("delta", "dkdv", "dq", "forward")
NO_KERNELS_PROFILED = "No kernels were profiled"  # ncu's warning when the profiled region launched nothing


class NcuUnavailable(RuntimeError):
    """ncu is missing, may not read the counters, or failed: the reason, for the fallback's label."""


def phase_label(phase: tuple[str, str]) -> str:
    return f"{phase[0]} {phase[1]}"


def phase_argument(phase: tuple[str, str]) -> str:
    """How the child's ``--pass`` spells a pass: 'flashattn:backward'."""
    return f"{phase[0]}:{phase[1]}"


def parse_phase(text: str) -> tuple[str, str]:
    """The pass of a ``--pass`` argument; ValueError naming the choices otherwise."""
    implementation, _, direction = text.partition(":")
    if (implementation, direction) not in PHASES:
        choices = ", ".join(phase_argument(p) for p in PHASES)
        raise ValueError(f"--pass must be one of {choices}, got {text!r}")
    return implementation, direction


# ---------------------------------------------------------------------------------------------
# Running the passes (the ncu child and the profiler fallback share this)
# ---------------------------------------------------------------------------------------------


def run_phases(shape, device, around: Callable[[tuple[str, str]], contextlib.AbstractContextManager],
               repeats: int = 1, phases: Sequence[tuple[str, str]] = PHASES) -> dict[str, str]:
    """Run each of ``phases`` ``repeats`` times inside ``around(phase)``; 'ok' or 'OOM' per pass label.

    Each implementation first runs a forward and a backward outside ``around``: that compiles the
    Triton kernels and lets cuBLAS pick its algorithms, so the measured calls are the steady state.
    The forward runs under no_grad; the backward runs ``torch.autograd.grad`` on one retained graph,
    whose forward also runs outside ``around``.
    """
    import torch

    from .demo import free_cached_memory, is_out_of_memory
    from .measure import attention_runner, gradients, make_inputs

    status: dict[str, str] = {}
    for implementation in IMPLEMENTATIONS:
        directions = [direction for direction in DIRECTIONS if (implementation, direction) in phases]
        if not directions:
            continue
        try:
            inputs = make_inputs(shape, device, requires_grad=True)
            forward = attention_runner(implementation, inputs, shape.causal)
            gradients(forward(), inputs)  # warm-up
            if "forward" in directions:
                with torch.no_grad(), around((implementation, "forward")):
                    for _ in range(repeats):
                        forward()
                status[phase_label((implementation, "forward"))] = "ok"
            if "backward" in directions:
                out = forward()
                with around((implementation, "backward")):
                    for _ in range(repeats):
                        gradients(out, inputs, retain_graph=True)
                status[phase_label((implementation, "backward"))] = "ok"
        except RuntimeError as error:  # torch.cuda.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(error):
                raise
            for direction in directions:
                status.setdefault(phase_label((implementation, direction)), "OOM")
        finally:
            inputs = forward = out = None
            free_cached_memory(device)
    return status


@contextlib.contextmanager
def cuda_profiler_range(phase: tuple[str, str]) -> Iterator[None]:
    """cudaProfilerStart/Stop around a pass: what ncu (``--profile-from-start off``) profiles.

    Process-wide, so autograd's device thread is covered. Synchronized on both sides: the warm-up's
    kernels finish before, and the pass's kernels before the stop.
    """
    import torch

    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        yield
        torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


def child_main(spec: str, phase: tuple[str, str]) -> int:
    """The process ncu profiles: one pass of one shape between cudaProfilerStart/Stop; its status as JSON."""
    import torch

    from .measure import LayerShape

    shape = LayerShape(**json.loads(spec))
    status = run_phases(shape, torch.device("cuda"), cuda_profiler_range, phases=(phase,))
    print(json.dumps({"status": status}), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# Nsight Compute: one run per pass, and its CSV
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTraffic:
    """One profiled kernel: its DRAM bytes, and the pass (phase label) it ran in."""

    id: int
    kernel: str
    read_bytes: float
    write_bytes: float
    phase: str | None = None

    @property
    def total_bytes(self) -> float:
        return self.read_bytes + self.write_bytes


def find_ncu(explicit: str | None = None) -> str | None:
    """``explicit`` if given, else ncu on PATH, else CUDA's default install location; None if none."""
    if explicit:
        return explicit
    found = shutil.which("ncu")
    if found:
        return found
    for directory in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if directory and Path(directory, "bin", "ncu").is_file():
            return str(Path(directory, "bin", "ncu"))
    return None


def child_command(shape, phase: tuple[str, str]) -> list[str]:
    return [sys.executable, "-m", "flashattn.tools.iomeasure", "--child", json.dumps(asdict(shape)),
            "--pass", phase_argument(phase)]


def ncu_profile_command(ncu: str, report: Path, log: Path, shape, phase: tuple[str, str]) -> list[str]:
    """Profile one pass: every kernel between the child's cudaProfilerStart and Stop, two DRAM counters."""
    return [ncu, "--target-processes", "all", "--profile-from-start", "off",
            "--metrics", ",".join(NCU_METRICS), "--export", str(report), "--force-overwrite",
            "--log-file", str(log), *child_command(shape, phase)]


def ncu_import_command(ncu: str, report: Path) -> list[str]:
    """Read the report back as CSV (``--print-units base``: bytes, not scaled units)."""
    return [ncu, "--import", str(report), "--csv", "--print-units", "base"]


def ncu_failure(output: str) -> str | None:
    """Why ncu could not measure, from its messages (no permission, an error); None if they show none."""
    if "ERR_NVGPUCTRPERM" in output:
        return ("ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): the driver restricts them "
                "to administrators (see https://developer.nvidia.com/ERR_NVGPUCTRPERM)")
    errors = [line.strip() for line in output.splitlines() if line.lstrip().startswith("==ERROR==")]
    if errors:
        return "ncu failed: " + errors[0].removeprefix("==ERROR==").strip()
    return None


def _metric_bytes(value: str, unit: str) -> float:
    scale = BYTE_UNITS.get(unit.strip().lower())
    if scale is None:
        raise NcuUnavailable(f"ncu's CSV has a DRAM counter in an unknown unit {unit!r}")
    try:
        # ncu groups thousands with commas ("1,048,576"); a byte count has no fraction to confuse it with
        return float(value.replace(",", "")) * scale
    except ValueError:
        raise NcuUnavailable(f"ncu's CSV has a DRAM counter that is not a number: {value!r}") from None


def parse_ncu_csv(text: str) -> list[KernelTraffic]:
    """The DRAM bytes of each kernel in ``ncu --csv`` output (the details page: one row per metric).

    ncu prefixes its CSV with its own messages (``==PROF== ...``, ``==WARNING== ...``): everything
    before the header row, the first that names "Kernel Name" and "Metric Value", is skipped. Rows of
    other metrics are ignored; units are converted to bytes. Raises NcuUnavailable when the text holds
    no such table, with the reason when ncu printed one.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line and '"Metric Value"' in line), None)
    if start is None:
        no_kernel = "ncu profiled no kernel" if NO_KERNELS_PROFILED in text else None
        raise NcuUnavailable(ncu_failure(text) or no_kernel or "ncu printed no metrics table")
    kernels: dict[int, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        metric = row.get("Metric Name")
        if metric not in NCU_METRICS or row.get("ID") is None:
            continue  # ncu's trailing messages, or metrics other than ours
        kernel_id = int(row["ID"].replace(",", ""))
        entry = kernels.setdefault(kernel_id, {"kernel": row["Kernel Name"]})
        entry[metric] = _metric_bytes(row["Metric Value"], row["Metric Unit"])
    if not kernels:
        raise NcuUnavailable(ncu_failure(text) or "ncu's CSV holds no DRAM counter")
    missing = [k for k, entry in kernels.items() if any(m not in entry for m in NCU_METRICS)]
    if missing:
        raise NcuUnavailable(f"ncu's CSV lacks a DRAM counter for kernel ID {missing[0]}")
    return [KernelTraffic(kernel_id, entry["kernel"], entry[NCU_METRICS[0]], entry[NCU_METRICS[1]])
            for kernel_id, entry in sorted(kernels.items())]


def _child_status(stdout: str, phase: tuple[str, str]) -> str:
    """The pass's status from the child's last JSON line; NcuUnavailable if it printed none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                return json.loads(line)["status"][phase_label(phase)]
    raise NcuUnavailable(f"the profiled process of the {phase_label(phase)} pass printed no status line")


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise NcuUnavailable(f"ncu did not finish in {timeout:.0f} s: {' '.join(command[:2])} ...") from None
    except OSError as error:
        raise NcuUnavailable(f"cannot run {command[0]}: {error.strerror or error}") from None


def _last_line(*texts: str) -> str:
    for text in texts:
        if text.strip():
            return text.strip().splitlines()[-1]
    return "no output"


def profile_pass(ncu: str, shape, phase: tuple[str, str], workdir: Path,
                 timeout: float = NCU_TIMEOUT_SECONDS) -> tuple[list[KernelTraffic], str]:
    """One ncu run of one pass: (its kernels, labelled with the pass; 'ok' or 'OOM')."""
    label = phase_label(phase)
    name = phase_argument(phase).replace(":", "-")
    report, log = workdir / f"{name}.ncu-rep", workdir / f"{name}.log"
    profiled = _run(ncu_profile_command(ncu, report, log, shape, phase), timeout)
    messages = "\n".join([log.read_text(errors="replace") if log.exists() else "", profiled.stdout,
                          profiled.stderr])
    reason = ncu_failure(messages)
    if profiled.returncode != 0 and "ERR_NVGPUCTRPERM" not in messages:
        # ncu passes the child's stderr through: its last line is the child's error, if it raised one
        reason = (f"ncu exited with status {profiled.returncode} profiling the {label} pass: "
                  f"{_last_line(profiled.stderr, messages)}" + (f" ({reason})" if reason else ""))
    if reason:
        raise NcuUnavailable(reason)
    status = _child_status(profiled.stdout, phase)
    if status != "ok":
        return [], status  # out of memory: nothing to import
    if NO_KERNELS_PROFILED in messages or not report.exists():
        raise NcuUnavailable(f"ncu profiled no kernel of the {label} pass (none ran between "
                             "cudaProfilerStart and cudaProfilerStop)")
    table = _run(ncu_import_command(ncu, report), timeout)
    if table.returncode != 0:
        raise NcuUnavailable(f"ncu --import failed: {_last_line(table.stderr)}")
    return [replace(kernel, phase=label) for kernel in parse_ncu_csv(table.stdout)], status


def measure_with_ncu(shape, ncu: str, timeout: float = NCU_TIMEOUT_SECONDS) -> tuple[list[KernelTraffic], dict]:
    """Profile each pass of ``shape`` in an ncu run of its own: (kernels with their pass, status per pass).

    An implementation whose forward ran out of memory is not run again for its backward: the child's
    warm-up, a forward and a backward, would run out of memory the same way.
    """
    kernels: list[KernelTraffic] = []
    status: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="flashattn-io-") as workdir:
        for phase in PHASES:
            implementation, direction = phase
            if direction == "backward" and status.get(phase_label((implementation, "forward"))) == "OOM":
                status[phase_label(phase)] = "OOM"
                continue
            found, status[phase_label(phase)] = profile_pass(ncu, shape, phase, Path(workdir), timeout)
            kernels += found
    return kernels, status


# ---------------------------------------------------------------------------------------------
# torch.profiler: kernel times
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTime:
    """One kernel's total device time in a pass, over ``repeats`` calls of the pass."""

    kernel: str
    seconds: float
    phase: str


def measure_with_profiler(shape, repeats: int = PROFILER_REPEATS) -> tuple[list[KernelTime], dict]:
    """Each pass ``repeats`` times under torch.profiler (CUDA activity): (kernel times, status per pass)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    found: list[KernelTime] = []

    @contextlib.contextmanager
    def profiled(phase: tuple[str, str]) -> Iterator[None]:
        torch.cuda.synchronize()
        profiler = profile(activities=[ProfilerActivity.CUDA])
        profiler.start()
        try:
            yield
            torch.cuda.synchronize()
        finally:
            profiler.stop()
        totals: dict[str, float] = {}
        for event in profiler.profiler.kineto_results.events():
            if event.device_type() == torch.autograd.DeviceType.CUDA and not event.is_user_annotation():
                totals[event.name()] = totals.get(event.name(), 0.0) + event.duration_ns() * 1e-9
        found.extend(KernelTime(name, seconds, phase_label(phase)) for name, seconds in totals.items())

    status = run_phases(shape, torch.device("cuda"), profiled, repeats)
    return found, status


# ---------------------------------------------------------------------------------------------
# Model against measurement
# ---------------------------------------------------------------------------------------------


def flashattn_model_kernel(name: str) -> str | None:
    """The IO model's kernel ('forward', 'delta', 'dkdv', 'dq') that a flashattn kernel name is."""
    lowered = name.lower()
    return next((word for word in FLASHATTN_KERNEL_WORDS if word in lowered), None)


@dataclass
class PassComparison:
    """One pass: the model's byte brackets and what was measured (bytes by ncu, or time by the profiler)."""

    implementation: str
    direction: str
    model_bytes: int  # no reuse across programs: the upper bracket
    model_once_bytes: int  # L2 kept every tile: the lower bracket
    status: str  # "ok", "OOM", or "not run"
    model_once_read_bytes: int = 0  # the reads of the lower bracket: each input read once
    read_bytes: float | None = None
    write_bytes: float | None = None
    seconds: float | None = None  # per call
    kernels: list[dict] = field(default_factory=list)

    @property
    def measured_bytes(self) -> float | None:
        if self.read_bytes is None or self.write_bytes is None:
            return None
        return self.read_bytes + self.write_bytes

    def implied_bandwidth(self, nbytes: int) -> float | None:
        return None if not self.seconds else nbytes / self.seconds

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["measured_bytes"] = self.measured_bytes
        data["measured_over_model"] = (None if self.measured_bytes is None
                                       else self.measured_bytes / self.model_bytes)
        data["implied_bandwidth"] = self.implied_bandwidth(self.model_bytes)
        data["implied_bandwidth_once"] = self.implied_bandwidth(self.model_once_bytes)
        return data


@dataclass
class IoMeasurement:
    method: str  # "ncu" or "profiler"
    device: str
    passes: list[PassComparison]
    fallback_reason: str | None = None  # why not ncu, for the profiler method
    repeats: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "device": self.device, "bytes_measured": self.method == "ncu",
                "fallback_reason": self.fallback_reason, "repeats": self.repeats,
                "passes": [p.to_dict() for p in self.passes]}


def _model_pass(report: IoReport, implementation: str, direction: str) -> PassReport:
    return getattr(report, f"{implementation}_{direction}")


def _empty_comparison(model: PassReport, status: str) -> PassComparison:
    """The model's side of one pass; the measured side is filled in by the caller."""
    return PassComparison(model.implementation, model.direction, model.nbytes, model.once_nbytes, status,
                          sum(t.once_nbytes for t in model.transfers if t.access == "read"))


def compare_traffic(report: IoReport, kernels: Sequence[KernelTraffic], status: dict[str, str],
                    device: str) -> IoMeasurement:
    """Sum ncu's bytes per pass and put them beside the model's; flashattn's kernels also one by one."""
    passes = []
    for implementation, direction in PHASES:
        label = phase_label((implementation, direction))
        model = _model_pass(report, implementation, direction)
        mine = [k for k in kernels if k.phase == label]
        comparison = _empty_comparison(model, status.get(label, "not run"))
        if mine:
            comparison.read_bytes = sum(k.read_bytes for k in mine)
            comparison.write_bytes = sum(k.write_bytes for k in mine)
        for kernel in mine:
            entry: dict[str, Any] = {"kernel": kernel.kernel, "read_bytes": kernel.read_bytes,
                                     "write_bytes": kernel.write_bytes}
            model_kernel = flashattn_model_kernel(kernel.kernel) if implementation == "flashattn" else None
            if model_kernel is not None:
                transfers = [t for t in model.transfers if t.kernel == model_kernel]
                entry.update(model_kernel=model_kernel, model_bytes=sum(t.nbytes for t in transfers),
                             model_once_bytes=sum(t.once_nbytes for t in transfers))
            comparison.kernels.append(entry)
        passes.append(comparison)
    return IoMeasurement("ncu", device, passes)


def compare_times(report: IoReport, times: Sequence[KernelTime], status: dict[str, str], device: str,
                  reason: str, repeats: int) -> IoMeasurement:
    """Per pass, the kernels' time per call, and the bandwidth that the model's bytes would imply."""
    passes = []
    for implementation, direction in PHASES:
        label = phase_label((implementation, direction))
        model = _model_pass(report, implementation, direction)
        mine = [t for t in times if t.phase == label]
        comparison = _empty_comparison(model, status.get(label, "not run"))
        if mine and comparison.status == "ok":
            comparison.seconds = sum(t.seconds for t in mine) / repeats
            comparison.kernels = [{"kernel": t.kernel, "seconds": t.seconds / repeats}
                                  for t in sorted(mine, key=lambda t: -t.seconds)]
        passes.append(comparison)
    return IoMeasurement("profiler", device, passes, fallback_reason=reason, repeats=repeats)


def measure(report: IoReport, shape, method: str = "auto", ncu: str | None = None, device_label: str = "",
            ncu_runner: Callable | None = None, profiler_runner: Callable | None = None) -> IoMeasurement:
    """Measure with ncu when ``method`` allows and it works, else with torch.profiler.

    ``method``: 'auto' (ncu if found, falling back to the profiler with the reason), 'ncu' (ncu or an
    NcuUnavailable error) or 'profiler'. The runners are parameters so that the logic can be tested
    without a GPU.
    """
    if method not in ("auto", "ncu", "profiler"):
        raise ValueError(f"method must be auto, ncu or profiler, got {method!r}")
    ncu_runner = ncu_runner or measure_with_ncu
    profiler_runner = profiler_runner or measure_with_profiler
    reason = "--measure-with profiler"
    if method != "profiler":
        path = find_ncu(ncu)
        if path is None:
            reason = "ncu (Nsight Compute) is not on PATH"
            if method == "ncu":
                raise NcuUnavailable(reason)
        else:
            try:
                kernels, status = ncu_runner(shape, path)
                return compare_traffic(report, kernels, status, device_label)
            except NcuUnavailable as error:
                if method == "ncu":
                    raise
                reason = str(error)
    times, status = profiler_runner(shape, PROFILER_REPEATS)
    return compare_times(report, times, status, device_label, reason, PROFILER_REPEATS)


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def short_kernel_name(name: str, width: int = 60) -> str:
    """A kernel's function name without return type, namespaces, template arguments and parameters."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    name = re.split(r"[<(]", name, maxsplit=1)[0].rsplit("::", 1)[-1]
    return name if len(name) <= width else name[: width - 3] + "..."


def _bandwidth(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e12:.2f} TB/s"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    from .iomodel import _markdown_table

    return _markdown_table(header, rows)


def _kernel_bytes(kernel: dict) -> str:
    model = ""
    if "model_bytes" in kernel:
        model = (f"   model {format_bytes(kernel['model_bytes'])}, "
                 f"L2 kept all {format_bytes(kernel['model_once_bytes'])}")
    return f"{format_bytes(kernel['read_bytes'] + kernel['write_bytes']):>10}{model}"


def _kernel_lines(passes: Sequence[PassComparison], describe: Callable[[dict], str]) -> list[str]:
    """Each pass, then a line per kernel (its short name, then ``describe(kernel)``).

    A pass without kernels says why (its status, or that none was recorded), so that no pass heading
    stands empty.
    """
    lines = []
    for p in passes:
        if not p.kernels:
            lines.append(f"  {p.implementation} {p.direction}: "
                         f"{'no kernel recorded' if p.status == 'ok' else p.status}")
            continue
        lines.append(f"  {p.implementation} {p.direction}:")
        lines += [f"    {short_kernel_name(k['kernel']):<60} {describe(k)}" for k in p.kernels]
    return lines


def format_measurement(measurement: IoMeasurement, report: IoReport) -> str:
    """The side-by-side table of model and measurement, then the kernels of each pass."""
    gpu = report.gpu
    lines = [""]
    if measurement.method == "ncu":
        lines.append(f"Measured on {measurement.device} with Nsight Compute: DRAM bytes read + written "
                     f"({' + '.join(NCU_METRICS)}), each kernel from a cold L2 (ncu flushes the caches).")
        lines.append("Reads below the 'L2 kept all' bracket cannot happen from a cold L2; writes can: what a "
                     "kernel writes last may still sit in L2 when it ends, uncounted.")
        header = ["", "model: no L2 reuse", "model: L2 kept all", "measured read", "measured write",
                  "measured", "measured / no-reuse model"]
        rows = []
        for p in measurement.passes:
            measured = p.measured_bytes
            rows.append([f"{p.implementation} {p.direction}", format_bytes(p.model_bytes),
                         format_bytes(p.model_once_bytes),
                         *(("-" if x is None else format_bytes(x)) for x in (p.read_bytes, p.write_bytes)),
                         format_bytes(measured) if measured is not None else p.status if p.status != "ok" else "-",
                         "-" if measured is None else f"{measured / p.model_bytes:.2f}"])
        lines += _table(header, rows)
        lines += ["", "Kernels (measured read + write; flashattn's beside the model's count for that kernel):"]
        lines += _kernel_lines(measurement.passes, _kernel_bytes)
    else:
        lines.append(f"NOT A BYTE MEASUREMENT: {measurement.fallback_reason}; so torch.profiler timed the kernels "
                     f"on {measurement.device} (mean of {measurement.repeats} calls per pass), and the bandwidth "
                     "below is the model's bytes over that time, which the model implies, not one measured.")
        header = ["", "kernel time", "model: no L2 reuse", "implied bandwidth", "model: L2 kept all",
                  "implied bandwidth (L2 kept all)"]
        rows = []
        for p in measurement.passes:
            rows.append([f"{p.implementation} {p.direction}",
                         format_seconds(p.seconds) if p.seconds else p.status,
                         format_bytes(p.model_bytes), _bandwidth(p.implied_bandwidth(p.model_bytes)),
                         format_bytes(p.model_once_bytes), _bandwidth(p.implied_bandwidth(p.model_once_bytes))])
        lines += _table(header, rows)
        lines += ["", f"{gpu.name} moves at most {gpu.bandwidth / 1e12:.2f} TB/s: an implied bandwidth above that "
                      "means the no-reuse count overcounts (L2 served re-read tiles); the real traffic lies "
                      "between the two brackets.",
                  "", "Kernels (time per call):"]
        lines += _kernel_lines(measurement.passes, lambda k: f"{format_seconds(k['seconds']):>10}")
    if report.problem.kv_heads != report.problem.heads:
        lines.append("Note: with GQA, standard attention copies K and V per query head (repeat_interleave); "
                     "the model assumes a broadcast.")
    if report.problem.causal:
        lines.append("Note: causal standard attention masks S in a pass of its own (masked_fill_), which the "
                     "model folds into the softmax.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# flashattn io --measure
# ---------------------------------------------------------------------------------------------

EXIT_USAGE = 2


def _usage_error(message: str) -> int:
    print(f"flashattn io: error: argument --measure: {message}", file=sys.stderr)
    return EXIT_USAGE


def device_tiling(problem, dtype, device) -> Tiling:
    """The tiles flashattn's kernels run for ``problem`` in ``dtype`` on ``device`` (configs' table)."""
    from .. import configs

    return Tiling(*(block_shape(config) for config in (
        configs.tile_config(phase, problem.head_dim, problem.causal, dtype, device, interpret=False,
                            seqlen=min(problem.seqlen_q, problem.seqlen_k) if phase == "forward" else 0)
        for phase in ("forward", "dkdv", "dq"))))


def detected_gpu_preset(name: str) -> str | None:
    """'h100' or 'h200' when the device's name says so (the presets hold their measured ceilings)."""
    return next((key for key in GPU_PRESETS if key in name.lower()), None)


def run_measure(args: argparse.Namespace, model: IoReport) -> int:
    """``flashattn io --measure``: the model for the tiles this GPU runs, then the measurement beside it."""
    import torch

    from ..backend import backend_override
    from .measure import LayerShape, device_label

    if not torch.cuda.is_available():
        return _usage_error("needs a CUDA GPU, and torch sees none (the model alone needs none: drop --measure)")
    try:
        if backend_override() == "torch":
            return _usage_error("FLASHATTN_BACKEND=torch runs the PyTorch path, not the kernels the model counts: "
                                "unset it")
    except ValueError as error:
        return _usage_error(str(error))
    device = torch.device("cuda")
    p = model.problem
    name = torch.cuda.get_device_name(device)
    gpu = gpu_from_args(args, default=detected_gpu_preset(name) or "h200")
    shape = LayerShape(p.batch, p.seqlen_q, p.seqlen_k, p.heads, p.kv_heads, p.head_dim, args.dtype, p.causal)
    report = analyze(p, device_tiling(p, shape.torch_dtype, device), gpu, args.sram_kb)
    label = device_label(device)
    print(f"flashattn io: measuring on {label} ({args.measure_with})", file=sys.stderr, flush=True)
    try:
        measurement = measure(report, shape, args.measure_with, args.ncu, label)
    except NcuUnavailable as error:
        print(f"flashattn io: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**report.to_dict(), "measured": measurement.to_dict()}, indent=2))
    else:
        print(format_report(report))
        print(format_measurement(measurement, report))
    return 0


# ---------------------------------------------------------------------------------------------
# The child's entry point
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashattn.tools.iomeasure",
                                     description="the process `flashattn io --measure` runs under ncu")
    parser.add_argument("--child", required=True, metavar="SPEC", help="the shape, as measure.LayerShape's JSON")
    parser.add_argument("--pass", required=True, dest="phase", metavar="IMPLEMENTATION:DIRECTION",
                        help="the pass to profile: " + ", ".join(phase_argument(p) for p in PHASES))
    args = parser.parse_args(argv)
    try:
        phase = parse_phase(args.phase)
    except ValueError as error:
        parser.error(str(error))
    return child_main(args.child, phase)




def add_arguments(parser: argparse.ArgumentParser) -> None:
    iomodel.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``flashattn io``: the model's report, and with ``--measure`` the kernels' real DRAM bytes beside it."""
    return iomodel.run(args, measure=run_measure)


if __name__ == "__main__":
    raise SystemExit(main())
