"""``flashattn io --measure`` (``flashattn.tools.iomeasure``): ncu's CSV, one ncu run per pass, the fallback to
torch.profiler, and the command line; on the CPU with canned ncu output and a fake ncu.

The fixtures in tests/data are ncu's details-page CSV for batch 1, seqlen 1024, 4 heads, head dim 64,
bf16, non-causal, one file per pass as one ncu run (``--profile-from-start off``) reports it: 4 standard
forward, 6 standard backward, 1 flashattn forward and 3 flashattn backward kernels, IDs from 0 in each.
Their units mix byte (with thousands separators), Kbyte, Mbyte and Gbyte.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
import torch

from flashattn.tools import iomeasure, iomodel
from flashattn.tools.iomeasure import (
    PHASES,
    KernelTime,
    NcuUnavailable,
    flashattn_model_kernel,
    format_measurement,
    measure,
    measure_with_ncu,
    ncu_failure,
    ncu_import_command,
    ncu_profile_command,
    parse_ncu_csv,
    parse_phase,
    run_phases,
)
from flashattn.tools.measure import LayerShape

DATA = Path(__file__).parent / "data"
LABELS = [f"{implementation} {direction}" for implementation, direction in PHASES]
SHAPE = LayerShape(1, 1024, 1024, 4, 4, 64, "bf16")
PERMISSION_LOG = (
    "==PROF== Connected to process 5120 (/usr/bin/python3.12)\n"
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
    "on the target device 0. For instructions on enabling permissions and to get more information see "
    "https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
    "==PROF== Disconnected from process 5120\n"
    "==WARNING== No kernels were profiled.\n"
)


def canned_csv(label: str) -> str:
    """ncu's CSV of the pass ``label`` ('flashattn backward')."""
    return (DATA / f"ncu-io-{label.replace(' ', '-')}.csv").read_text()


def report() -> iomodel.IoReport:
    problem = iomodel.AttentionProblem(1, 1024, 1024, 4, 4, 64, 2, False)
    return iomodel.analyze(problem)


# ---------------------------------------------------------------------------------------------
# Parsing ncu's CSV
# ---------------------------------------------------------------------------------------------


def test_parse_reads_every_kernel_in_bytes_whatever_the_unit():
    forward = parse_ncu_csv(canned_csv("standard forward"))
    assert [k.id for k in forward] == [0, 1, 2, 3] and all(k.phase is None for k in forward)
    assert forward[0].read_bytes == pytest.approx(524_290)  # 524.29 Kbyte: ncu's K is 1000
    assert forward[1].write_bytes == pytest.approx(8_390_000)  # 8.39 Mbyte
    assert forward[2].kernel.startswith("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8")
    assert parse_ncu_csv(canned_csv("standard backward"))[5].read_bytes == 524_288  # "524,288": separators
    flash_forward = parse_ncu_csv(canned_csv("flashattn forward"))
    assert [(k.kernel, k.total_bytes) for k in flash_forward] == [("attention_forward_kernel", 1_613_824 + 540_672)]
    dkdv = parse_ncu_csv(canned_csv("flashattn backward"))[1]
    assert dkdv.kernel == "dkdv_kernel" and dkdv.read_bytes == pytest.approx(2_150_400)  # 0.0021504 Gbyte


def test_parse_skips_ncu_messages_and_other_metrics():
    extra = ('"3","41240","python3.12","127.0.0.1","dq_kernel","1","7","(256, 1, 1)","(8, 4, 1)","0","9.0",'
             '"Command line profiler metrics","gpu__time_duration.sum","nsecond","12,345"')
    kernels = parse_ncu_csv("==WARNING== something\n" + canned_csv("flashattn backward") + extra + "\n")
    assert len(kernels) == 3  # ID 3 has no DRAM counter: not a kernel of ours


@pytest.mark.parametrize(("text", "reason"), [
    (PERMISSION_LOG, "ERR_NVGPUCTRPERM"),
    ("==PROF== Disconnected\n==WARNING== No kernels were profiled.\n", "no kernel"),
    ("hello\n", "no metrics table"),
    (canned_csv("flashattn forward").splitlines()[1] + "\n", "no DRAM counter"),  # the header alone
])
def test_parse_refuses_output_without_counters_and_says_why(text, reason):
    with pytest.raises(NcuUnavailable, match=reason):
        parse_ncu_csv(text)


def test_parse_refuses_unknown_units_and_missing_counters():
    details = canned_csv("standard forward")
    with pytest.raises(NcuUnavailable, match="unknown unit 'furlong'"):
        parse_ncu_csv(details.replace('"Kbyte"', '"furlong"'))
    one_counter = "\n".join(line for line in details.splitlines() if "dram__bytes_write" not in line)
    with pytest.raises(NcuUnavailable, match="lacks a DRAM counter for kernel ID 0"):
        parse_ncu_csv(one_counter)


def test_ncu_failure_reasons():
    assert "administrators" in ncu_failure(PERMISSION_LOG)
    assert ncu_failure("==ERROR== Failed to prepare kernel for profiling\n") == (
        "ncu failed: Failed to prepare kernel for profiling")
    assert ncu_failure(canned_csv("standard backward")) is None
    # a pass that ran out of memory launched nothing: only the caller, which knows its status, may call that a
    # failure
    assert ncu_failure("==WARNING== No kernels were profiled.\n") is None


@pytest.mark.parametrize(("name", "kernel"), [("attention_forward_kernel", "forward"), ("delta_kernel", "delta"),
                                              ("dkdv_kernel", "dkdv"), ("dq_kernel", "dq"), ("ampere_gemm", None)])
def test_flashattn_kernel_names_map_to_the_model(name, kernel):
    assert flashattn_model_kernel(name) == kernel


# ---------------------------------------------------------------------------------------------
# The commands, and one ncu run per pass (with a fake ncu)
# ---------------------------------------------------------------------------------------------


def test_profile_command_profiles_between_profiler_start_and_stop(tmp_path):
    command = ncu_profile_command("/opt/ncu", tmp_path / "r.ncu-rep", tmp_path / "log", SHAPE,
                                  ("flashattn", "backward"))
    assert command[0] == "/opt/ncu"
    assert command[command.index("--metrics") + 1] == "dram__bytes_read.sum,dram__bytes_write.sum"
    assert command[command.index("--target-processes") + 1] == "all"
    # the child's cudaProfilerStart/Stop, process-wide, choose the kernels: no NVTX filter, which is per thread
    assert command[command.index("--profile-from-start") + 1] == "off"
    assert not any("nvtx" in arg for arg in command)
    child = command[command.index(sys.executable):]
    assert child[1:4] == ["-m", "flashattn.tools.iomeasure", "--child"]
    assert LayerShape(**json.loads(child[4])) == SHAPE
    assert child[5:] == ["--pass", "flashattn:backward"]


def test_import_command():
    assert ncu_import_command("ncu", Path("r.ncu-rep")) == ["ncu", "--import", "r.ncu-rep", "--csv",
                                                            "--print-units", "base"]


def test_the_childs_pass_argument():
    assert [parse_phase(f"{implementation}:{direction}") for implementation, direction in PHASES] == list(PHASES)
    with pytest.raises(ValueError, match="--pass must be one of standard:forward, .*got 'flashattn:sideways'"):
        parse_phase("flashattn:sideways")


def test_the_child_refuses_a_bad_pass_as_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        iomeasure.main(["--child", "{}", "--pass", "standard"])
    assert exit_info.value.code == 2 and "--pass must be one of" in capsys.readouterr().err


FAKE_NCU = '''#!{python}
"""A stand-in for ncu. Profiling runs no child but answers as ncu would with one under it (the report
names the pass, the child's status line on stdout); --import prints that pass's canned CSV.
FAKE_NCU_MODE: ok, permission, nothing (no kernel profiled), crash, silent (no status line), or
oom:IMPLEMENTATION:DIRECTION (that pass runs out of memory). Each call is appended to FAKE_NCU_CALLS."""
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_NCU_CALLS"], "a") as calls:
    calls.write(json.dumps(args) + "\\n")
if "--import" in args:
    label = Path(args[args.index("--import") + 1]).read_text()
    sys.stdout.write(Path({data!r}, "ncu-io-" + label.replace(" ", "-") + ".csv").read_text())
    sys.exit(0)
mode = os.environ["FAKE_NCU_MODE"]
log = Path(args[args.index("--log-file") + 1])
phase = args[args.index("--pass") + 1]
label = phase.replace(":", " ")
connected = "==PROF== Connected to process 1\\n"
if mode == "permission":
    log.write_text({permission!r})
    sys.exit(0)
if mode == "crash":
    log.write_text(connected + "==ERROR== The application returned an error code (1).\\n")
    sys.stderr.write("Traceback (most recent call last):\\nRuntimeError: boom\\n")
    sys.exit(1)
if mode in ("nothing", "oom:" + phase):
    log.write_text(connected + "==PROF== Disconnected from process 1\\n==WARNING== No kernels were profiled.\\n")
else:
    Path(args[args.index("--export") + 1]).write_text(label)
    log.write_text(connected + "==PROF== Disconnected from process 1\\n")
if mode != "silent":
    print(json.dumps({{"status": {{label: "OOM" if mode == "oom:" + phase else "ok"}}}}))
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """measure_with_ncu against the fake ncu in a mode; ``.calls``: the argument lists ncu was called with."""
    path = tmp_path / "ncu"
    path.write_text(FAKE_NCU.format(python=sys.executable, data=str(DATA), permission=PERMISSION_LOG))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_NCU_CALLS", str(calls))

    def run(mode):
        monkeypatch.setenv("FAKE_NCU_MODE", mode)
        calls.write_text("")
        try:
            return measure_with_ncu(SHAPE, str(path))
        finally:
            run.calls = [json.loads(line) for line in calls.read_text().splitlines()]

    return run


def profiled_passes(calls: list[list[str]]) -> list[str]:
    return [args[args.index("--pass") + 1] for args in calls if "--import" not in args]


def test_measure_with_ncu_profiles_each_pass_in_a_run_of_its_own(fake_ncu):
    kernels, status = fake_ncu("ok")
    assert status == dict.fromkeys(LABELS, "ok")
    assert profiled_passes(fake_ncu.calls) == ["standard:forward", "flashattn:forward", "standard:backward",
                                               "flashattn:backward"]
    assert sum("--import" in args for args in fake_ncu.calls) == 4
    assert [k.phase for k in kernels] == (["standard forward"] * 4 + ["flashattn forward"]
                                          + ["standard backward"] * 6 + ["flashattn backward"] * 3)
    assert [k.kernel for k in kernels if k.phase == "flashattn backward"] == ["delta_kernel", "dkdv_kernel",
                                                                              "dq_kernel"]


def test_an_out_of_memory_forward_skips_its_backward(fake_ncu):
    kernels, status = fake_ncu("oom:standard:forward")
    assert status == {"standard forward": "OOM", "flashattn forward": "ok", "standard backward": "OOM",
                      "flashattn backward": "ok"}
    assert profiled_passes(fake_ncu.calls) == ["standard:forward", "flashattn:forward", "flashattn:backward"]
    assert {k.phase for k in kernels} == {"flashattn forward", "flashattn backward"}


def test_an_out_of_memory_backward_is_a_status_not_a_failure(fake_ncu):
    kernels, status = fake_ncu("oom:flashattn:backward")
    assert status["flashattn backward"] == "OOM" and status["standard backward"] == "ok"
    assert not any(k.phase == "flashattn backward" for k in kernels)


@pytest.mark.parametrize(("mode", "reason"), [
    ("permission", "ERR_NVGPUCTRPERM"),
    # what the H200 showed with NVTX ranges: the pass ran and ncu profiled none of its kernels
    ("nothing", r"no kernel of the standard forward pass \(none ran between cudaProfilerStart"),
    ("crash", r"exited with status 1 profiling the standard forward pass: RuntimeError: boom \(ncu failed: "
              r"The application returned an error code \(1\)\.\)"),
    ("silent", "standard forward pass printed no status line"),
])
def test_measure_with_ncu_says_why_it_failed(fake_ncu, mode, reason):
    with pytest.raises(NcuUnavailable, match=reason):
        fake_ncu(mode)
    assert len(fake_ncu.calls) == 1  # the first failed run ends the measurement


def test_a_missing_ncu_executable_is_unavailable_not_a_crash(tmp_path):
    with pytest.raises(NcuUnavailable, match="cannot run"):
        measure_with_ncu(SHAPE, str(tmp_path / "no-such-ncu"))


# ---------------------------------------------------------------------------------------------
# Model against measurement, and the fallback
# ---------------------------------------------------------------------------------------------


def ncu_ok(shape, path):
    """What measure_with_ncu returns for the canned runs: every kernel labelled with its pass."""
    kernels = [dataclasses.replace(kernel, phase=label) for label in LABELS
               for kernel in parse_ncu_csv(canned_csv(label))]
    return kernels, dict.fromkeys(LABELS, "ok")


def ncu_denied(shape, path):
    raise NcuUnavailable(ncu_failure(PERMISSION_LOG))


def profiler_times(shape, repeats):
    times = [KernelTime("attention_forward_kernel", 5 * 2e-6, "flashattn forward"),
             KernelTime("dkdv_kernel", 5 * 6e-6, "flashattn backward"),
             KernelTime("dq_kernel", 5 * 4e-6, "flashattn backward"),
             KernelTime("cunn_SoftMaxForward", 5 * 5e-6, "standard forward")]
    return times, {"standard forward": "ok", "standard backward": "OOM", "flashattn forward": "ok",
                   "flashattn backward": "ok"}


def never(*args):
    raise AssertionError("must not run")


def test_ncu_bytes_are_summed_per_pass_beside_the_model():
    measurement = measure(report(), SHAPE, "auto", ncu="/fake/ncu", ncu_runner=ncu_ok, profiler_runner=never)
    assert measurement.method == "ncu"
    passes = {f"{p.implementation} {p.direction}": p for p in measurement.passes}
    flash_forward = passes["flashattn forward"]
    assert flash_forward.read_bytes == 1_613_824 and flash_forward.write_bytes == 540_672
    assert flash_forward.model_bytes == 9_453_568 and flash_forward.model_once_bytes == 2_113_536
    backward = passes["flashattn backward"]
    assert backward.measured_bytes == pytest.approx(1_048_576 + 16_384 + 2_150_400 + 1_048_576 + 2_130_000
                                                    + 524_288)
    dkdv = next(k for k in backward.kernels if k["kernel"] == "dkdv_kernel")
    assert dkdv["model_kernel"] == "dkdv" and dkdv["model_bytes"] == 18_350_080 + 1_048_576
    assert all("model_bytes" not in k for k in passes["standard forward"].kernels)
    assert passes["standard forward"].measured_bytes == pytest.approx(2 * 524_290 + 1_050_000 + 8_390_000
                                                                      + 2 * 8_390_000 + 8_910_000 + 524_290)
    text = format_measurement(measurement, report())
    assert "Nsight Compute" in text and "NOT A BYTE MEASUREMENT" not in text
    assert "dkdv_kernel" in text and "model 19.4 MB" in text
    assert " cunn_SoftMaxForward " in text  # names shortened to the function, full in the JSON
    data = json.loads(json.dumps(measurement.to_dict()))
    assert data["bytes_measured"] is True and data["fallback_reason"] is None
    assert data["passes"][1]["measured_over_model"] == pytest.approx(2_154_496 / 9_453_568)


def test_permission_failure_falls_back_to_kernel_times_labelled_as_not_bytes():
    measurement = measure(report(), SHAPE, "auto", ncu="/fake/ncu", ncu_runner=ncu_denied,
                          profiler_runner=profiler_times)
    assert measurement.method == "profiler" and "ERR_NVGPUCTRPERM" in measurement.fallback_reason
    passes = {f"{p.implementation} {p.direction}": p for p in measurement.passes}
    forward = passes["flashattn forward"]
    assert forward.seconds == pytest.approx(2e-6)  # per call: the runner's totals over 5 repeats
    assert forward.implied_bandwidth(forward.model_bytes) == pytest.approx(9_453_568 / 2e-6)
    assert passes["flashattn backward"].seconds == pytest.approx(10e-6)
    assert passes["standard backward"].status == "OOM" and passes["standard backward"].seconds is None
    assert forward.measured_bytes is None
    text = format_measurement(measurement, report())
    assert "NOT A BYTE MEASUREMENT" in text and "ERR_NVGPUCTRPERM" in text and "OOM" in text
    # every pass heading has its kernels under it, or says why it has none
    kernels = [line.split() for line in text.split("Kernels (time per call):\n", 1)[1].splitlines()]
    assert kernels[:8] == [["standard", "forward:"], ["cunn_SoftMaxForward", "5.00", "us"],
                           ["flashattn", "forward:"], ["attention_forward_kernel", "2.00", "us"],
                           ["standard", "backward:", "OOM"],
                           ["flashattn", "backward:"], ["dkdv_kernel", "6.00", "us"], ["dq_kernel", "4.00", "us"]]
    data = measurement.to_dict()
    assert data["bytes_measured"] is False and data["passes"][1]["implied_bandwidth"] == pytest.approx(
        9_453_568 / 2e-6)


def test_no_ncu_falls_back_with_that_reason(monkeypatch):
    monkeypatch.setattr(iomeasure, "find_ncu", lambda explicit=None: None)
    measurement = measure(report(), SHAPE, "auto", ncu_runner=never, profiler_runner=profiler_times)
    assert measurement.method == "profiler" and "not on PATH" in measurement.fallback_reason


def test_forced_ncu_does_not_fall_back(monkeypatch):
    with pytest.raises(NcuUnavailable, match="ERR_NVGPUCTRPERM"):
        measure(report(), SHAPE, "ncu", ncu="/fake/ncu", ncu_runner=ncu_denied, profiler_runner=never)
    monkeypatch.setattr(iomeasure, "find_ncu", lambda explicit=None: None)
    with pytest.raises(NcuUnavailable, match="not on PATH"):
        measure(report(), SHAPE, "ncu", ncu_runner=never, profiler_runner=never)


def test_forced_profiler_skips_ncu():
    measurement = measure(report(), SHAPE, "profiler", ncu="/fake/ncu", ncu_runner=never,
                          profiler_runner=profiler_times)
    assert measurement.method == "profiler" and measurement.fallback_reason == "--measure-with profiler"


def test_find_ncu_prefers_the_explicit_path_then_path(tmp_path, monkeypatch):
    assert iomeasure.find_ncu("/x/ncu") == "/x/ncu"
    (tmp_path / "ncu").write_text("")
    (tmp_path / "ncu").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert iomeasure.find_ncu() == str(tmp_path / "ncu")


# ---------------------------------------------------------------------------------------------
# The passes themselves (the CPU path stands in for the GPU)
# ---------------------------------------------------------------------------------------------


def test_run_phases_runs_every_pass_in_its_range(torch_backend):
    entered = []

    @contextlib.contextmanager
    def around(phase):
        entered.append(phase)
        yield

    shape = LayerShape(1, 32, 32, 2, 1, 16, "float32", causal=True)
    status = run_phases(shape, torch.device("cpu"), around, repeats=2)
    assert status == dict.fromkeys(("standard forward", "standard backward", "flashattn forward",
                                    "flashattn backward"), "ok")
    assert entered == [("standard", "forward"), ("standard", "backward"), ("flashattn", "forward"),
                       ("flashattn", "backward")]


def test_run_phases_reports_out_of_memory_per_implementation(torch_backend, monkeypatch):
    from flashattn.tools import bench

    def out_of_memory(*args):
        def run():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return run

    monkeypatch.setitem(bench.PROVIDERS, "naive", out_of_memory)
    status = run_phases(LayerShape(1, 16, 16, 1, 1, 16, "float32"), torch.device("cpu"),
                        lambda phase: contextlib.nullcontext())
    assert status == {"standard forward": "OOM", "standard backward": "OOM", "flashattn forward": "ok",
                      "flashattn backward": "ok"}


def test_the_child_profiles_only_its_pass_between_profiler_start_and_stop(torch_backend, monkeypatch):
    """One pass: the warm-up and the graph's forward before cudaProfilerStart, the measured call inside."""
    from flashattn.tools import measure as layer

    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: events.append("synchronize"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append("stop"))
    real_gradients = layer.gradients

    def gradients(*args, **kwargs):
        events.append("backward")
        return real_gradients(*args, **kwargs)

    monkeypatch.setattr(layer, "gradients", gradients)
    shape = LayerShape(1, 32, 32, 2, 2, 16, "float32")
    status = run_phases(shape, torch.device("cpu"), iomeasure.cuda_profiler_range, phases=(("flashattn", "backward"),))
    assert status == {"flashattn backward": "ok"}  # standard attention not even built
    # the warm-up's backward, then the measured one alone between start and stop (synchronized before the stop)
    assert events == ["backward", "synchronize", "start", "backward", "synchronize", "stop"]


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    iomodel.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_measure_without_a_gpu_is_a_usage_error(capsys):
    assert iomeasure.run(parse("--seqlen", "1024", "--measure")) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashattn io: error: argument --measure:") and "CUDA GPU" in err


@pytest.mark.parametrize("flag", ["--block-m", "--block-n"])
def test_measure_refuses_tile_overrides(flag, capsys):
    assert iomeasure.run(parse("--seqlen", "1024", "--measure", flag, "64")) == 2
    assert f"argument {flag}: --measure runs the tiles" in capsys.readouterr().err


def test_measure_validates_the_shape_first(capsys):
    assert iomeasure.run(parse("--measure")) == 2
    assert "argument --seqlen" in capsys.readouterr().err


def test_bad_measure_with_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("--seqlen", "64", "--measure", "--measure-with", "nsys")
    assert exit_info.value.code == 2 and "--measure-with" in capsys.readouterr().err


def test_measure_plumbing_with_the_gpu_faked(monkeypatch, capsys):
    """On a (faked) H100 without ncu: the H100 preset, the device's tiles, and the fallback in the JSON."""
    from flashattn import configs
    from flashattn.tools import measure

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(measure, "device_label", lambda device: "NVIDIA H100 80GB HBM3 (faked)")
    monkeypatch.setattr(configs, "gpu_family", lambda device: "hopper")
    monkeypatch.setattr(iomeasure, "find_ncu", lambda explicit=None: None)
    monkeypatch.setattr(iomeasure, "measure_with_profiler", profiler_times)
    monkeypatch.delenv("FLASHATTN_BACKEND", raising=False)
    assert iomeasure.run(parse("--seqlen", "1024", "--heads", "4", "--head-dim", "64", "--measure", "--json")) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["gpu"]["name"] == "H100 (measured)"  # picked from the device's name
    assert data["tiling"]["forward"] == {"block_m": 128, "block_n": 64, "passes": 1}  # configs' Hopper table, hdim 64
    assert data["measured"]["method"] == "profiler" and "not on PATH" in data["measured"]["fallback_reason"]
    assert "measuring on NVIDIA H100 80GB HBM3 (faked)" in captured.err
    assert iomeasure.run(parse("--seqlen", "1024", "--heads", "4", "--head-dim", "64", "--measure")) == 0
    text = capsys.readouterr().out
    assert text.index("Attention IO:") < text.index("NOT A BYTE MEASUREMENT")


def test_measure_refuses_the_torch_backend(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    assert iomeasure.run(parse("--seqlen", "1024", "--measure")) == 2
    assert "FLASHATTN_BACKEND=torch" in capsys.readouterr().err


def test_the_model_alone_keeps_its_json_shape(capsys):
    assert iomodel.run(parse("--seqlen", "256", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert "measured" not in data and data["gpu"]["name"] == "H200 (measured)"


# ---------------------------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_profiler_measure_times_every_pass(capsys):
    assert iomeasure.run(parse("--seqlen", "512", "--heads", "4", "--head-dim", "64", "--measure",
                             "--measure-with", "profiler", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    measured = data["measured"]
    assert measured["method"] == "profiler" and not measured["bytes_measured"]
    for entry in measured["passes"]:
        assert entry["status"] == "ok" and entry["seconds"] > 0 and entry["implied_bandwidth"] > 0


@pytest.mark.gpu
def test_gpu_child_runs_each_pass_without_ncu(capsys):
    """The child as ncu runs it, here without ncu (cudaProfilerStart/Stop are then no-ops)."""
    spec = json.dumps(dataclasses.asdict(LayerShape(1, 256, 256, 2, 2, 64, "bf16")))
    for implementation, direction in PHASES:
        assert iomeasure.main(["--child", spec, "--pass", f"{implementation}:{direction}"]) == 0
        line = capsys.readouterr().out.strip().splitlines()[-1]
        assert json.loads(line) == {"status": {f"{implementation} {direction}": "ok"}}


@pytest.mark.gpu
@pytest.mark.skipif(iomeasure.find_ncu() is None, reason="needs Nsight Compute (ncu)")
def test_gpu_ncu_measure_reads_dram_bytes_of_every_pass(capsys):
    started = time.monotonic()
    assert iomeasure.run(parse("--seqlen", "1024", "--heads", "4", "--head-dim", "64", "--measure", "--json")) == 0
    seconds = time.monotonic() - started
    measured = json.loads(capsys.readouterr().out)["measured"]
    if measured["method"] == "profiler":  # only a missing permission excuses the fallback: the rest are bugs
        assert "ERR_NVGPUCTRPERM" in measured["fallback_reason"], measured["fallback_reason"]
        return
    assert measured["bytes_measured"] is True
    assert seconds < 120, f"4 ncu runs of a small shape took {seconds:.0f} s"
    # ncu starts every kernel from a cold L2, so each input byte comes from DRAM at least once: the reads
    # of the "L2 kept all" bracket are a floor for the measured reads (writes may still sit in L2 when the
    # kernel ends, so they have no floor); the no-reuse count is a ceiling (20% for sector granularity).
    for entry in measured["passes"]:
        assert entry["status"] == "ok" and entry["kernels"] and entry["measured_bytes"] > 0, entry
        if entry["implementation"] != "flashattn":
            continue
        assert entry["read_bytes"] >= 0.9 * entry["model_once_read_bytes"], entry
        assert entry["measured_bytes"] <= 1.2 * entry["model_bytes"], entry
        names = {flashattn_model_kernel(k["kernel"]) for k in entry["kernels"]}
        # the backward's kernels come from autograd's device thread: they must be there
        assert names >= ({"forward"} if entry["direction"] == "forward" else {"delta", "dkdv", "dq"}), names
    assert os.environ.get("FLASHATTN_BACKEND") != "torch"
