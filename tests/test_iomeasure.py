"""``flashattn io --measure`` (``flashattn.iomeasure``): ncu's CSV, the attribution of kernels to passes,
the fallback to torch.profiler, and the command line; on the CPU with canned ncu output and a fake ncu.

The fixtures in tests/data are ncu's details-page CSV for batch 1, seqlen 1024, 4 heads, head dim 64,
bf16, non-causal (kernel IDs 0-13: 4 standard forward, 6 standard backward, 1 flashattn forward, 3
flashattn backward kernels), once with the kernels' names and once renamed after their NVTX ranges.
Their units mix byte (with thousands separators), Kbyte, Mbyte and Gbyte.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from flashattn import iomeasure, iomodel
from flashattn.iomeasure import (
    KernelTime,
    KernelTraffic,
    NcuUnavailable,
    attribute_phases,
    flashattn_model_kernel,
    format_measurement,
    measure,
    measure_with_ncu,
    ncu_failure,
    ncu_import_command,
    ncu_profile_command,
    parse_ncu_csv,
    run_phases,
)
from flashattn.measure import LayerShape

DATA = Path(__file__).parent / "data"
DETAILS = (DATA / "ncu-io-details.csv").read_text()
DETAILS_NVTX = (DATA / "ncu-io-details-nvtx.csv").read_text()
SHAPE = LayerShape(1, 1024, 1024, 4, 4, 64, "bf16")
PERMISSION_LOG = (
    "==PROF== Connected to process 5120 (/usr/bin/python3.12)\n"
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
    "on the target device 0. For instructions on enabling permissions and to get more information see "
    "https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
    "==PROF== Disconnected from process 5120\n"
    "==WARNING== No kernels were profiled.\n"
)


def report() -> iomodel.IoReport:
    problem = iomodel.AttentionProblem(1, 1024, 1024, 4, 4, 64, 2, False)
    return iomodel.analyze(problem)


# ---------------------------------------------------------------------------------------------
# Parsing ncu's CSV
# ---------------------------------------------------------------------------------------------


def test_parse_reads_every_kernel_in_bytes_whatever_the_unit():
    kernels = parse_ncu_csv(DETAILS)
    assert [k.id for k in kernels] == list(range(14))
    by_id = {k.id: k for k in kernels}
    assert by_id[0].read_bytes == pytest.approx(524_290)  # 524.29 Kbyte: ncu's K is 1000
    assert by_id[1].write_bytes == pytest.approx(8_390_000)  # 8.39 Mbyte
    assert by_id[9].read_bytes == 524_288  # "524,288" byte: thousands separators
    assert by_id[12].read_bytes == pytest.approx(2_150_400)  # 0.0021504 Gbyte
    assert by_id[10].kernel == "attention_forward_kernel"
    assert by_id[10].total_bytes == 1_613_824 + 540_672
    assert by_id[2].kernel.startswith("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8")


def test_parse_skips_ncu_messages_and_other_metrics():
    extra = ('"14","41237","python3.12","127.0.0.1","dq_kernel","1","7","(256, 1, 1)","(8, 4, 1)","0","9.0",'
             '"Command line profiler metrics","gpu__time_duration.sum","nsecond","12,345"')
    kernels = parse_ncu_csv("==WARNING== something\n" + DETAILS + extra + "\n")
    assert len(kernels) == 14  # ID 14 has no DRAM counter: not a kernel of ours


@pytest.mark.parametrize(("text", "reason"), [
    (PERMISSION_LOG, "ERR_NVGPUCTRPERM"),
    ("==PROF== Disconnected\n==WARNING== No kernels were profiled.\n", "no kernel"),
    ("hello\n", "no metrics table"),
    (DETAILS.splitlines()[1] + "\n", "no DRAM counter"),  # the header alone
])
def test_parse_refuses_output_without_counters_and_says_why(text, reason):
    with pytest.raises(NcuUnavailable, match=reason):
        parse_ncu_csv(text)


def test_parse_refuses_unknown_units_and_missing_counters():
    with pytest.raises(NcuUnavailable, match="unknown unit 'furlong'"):
        parse_ncu_csv(DETAILS.replace('"Kbyte"', '"furlong"'))
    one_counter = "\n".join(line for line in DETAILS.splitlines() if "dram__bytes_write" not in line)
    with pytest.raises(NcuUnavailable, match="lacks a DRAM counter for kernel ID 0"):
        parse_ncu_csv(one_counter)


def test_ncu_failure_reasons():
    assert "administrators" in ncu_failure(PERMISSION_LOG)
    assert ncu_failure("==ERROR== Failed to prepare kernel for profiling\n") == (
        "ncu failed: Failed to prepare kernel for profiling")
    assert ncu_failure(DETAILS) is None


def test_attribute_phases_joins_the_renamed_report_on_the_ids():
    kernels = attribute_phases(parse_ncu_csv(DETAILS), parse_ncu_csv(DETAILS_NVTX))
    phases = [k.phase for k in kernels]
    assert phases == (["standard forward"] * 4 + ["standard backward"] * 6 + ["flashattn forward"]
                      + ["flashattn backward"] * 3)


def test_attribute_phases_finds_the_range_inside_a_longer_name():
    renamed = [KernelTraffic(0, "<default domain>:flashattn-io:flashattn:backward/", 0, 0)]
    assert attribute_phases([KernelTraffic(0, "dq_kernel", 1, 2)], renamed)[0].phase == "flashattn backward"


def test_attribute_phases_refuses_a_report_without_ranges():
    with pytest.raises(NcuUnavailable, match="NVTX"):
        attribute_phases(parse_ncu_csv(DETAILS), parse_ncu_csv(DETAILS))


@pytest.mark.parametrize(("name", "kernel"), [("attention_forward_kernel", "forward"), ("delta_kernel", "delta"),
                                              ("dkdv_kernel", "dkdv"), ("dq_kernel", "dq"), ("ampere_gemm", None)])
def test_flashattn_kernel_names_map_to_the_model(name, kernel):
    assert flashattn_model_kernel(name) == kernel


# ---------------------------------------------------------------------------------------------
# The commands
# ---------------------------------------------------------------------------------------------


def test_profile_command_filters_by_nvtx_and_asks_for_the_dram_counters(tmp_path):
    command = ncu_profile_command("/opt/ncu", tmp_path / "r.ncu-rep", tmp_path / "log", SHAPE)
    assert command[0] == "/opt/ncu"
    assert command[command.index("--metrics") + 1] == "dram__bytes_read.sum,dram__bytes_write.sum"
    assert command[command.index("--target-processes") + 1] == "all"
    assert "--nvtx" in command
    # autograd launches the backward from its own thread: the ranges must be scoped to the process
    assert command[command.index("--nvtx-push-pop-scope") + 1] == "process"
    includes = [command[i + 1] for i, arg in enumerate(command) if arg == "--nvtx-include"]
    assert sorted(includes) == sorted(f"flashattn-io:{impl}:{direction}/" for impl in ("standard", "flashattn")
                                      for direction in ("forward", "backward"))
    child = command[command.index(sys.executable):]
    assert child[1:4] == ["-m", "flashattn.iomeasure", "--child"]
    assert LayerShape(**json.loads(child[4])) == SHAPE


def test_import_commands():
    plain = ncu_import_command("ncu", Path("r.ncu-rep"), by_range=False)
    assert plain == ["ncu", "--import", "r.ncu-rep", "--csv", "--print-units", "base"]
    assert ncu_import_command("ncu", Path("r.ncu-rep"), by_range=True)[-2:] == ["--print-nvtx-rename", "kernel"]


FAKE_NCU = '''#!{python}
"""A stand-in for ncu: profiling writes the report and the log; --import prints a canned CSV."""
import os, sys
from pathlib import Path
args = sys.argv[1:]
mode = os.environ["FAKE_NCU_MODE"]
if "--import" in args:
    name = "ncu-io-details-nvtx.csv" if "--print-nvtx-rename" in args else "ncu-io-details.csv"
    sys.stdout.write(Path({data!r}, name).read_text())
    sys.exit(0)
log = Path(args[args.index("--log-file") + 1])
if mode == "permission":
    log.write_text({permission!r})
    sys.exit(0)
Path(args[args.index("--export") + 1]).write_bytes(b"report")
log.write_text("==PROF== Connected to process 1\\n==PROF== Disconnected from process 1\\n")
print('{{"status": {{"standard forward": "ok", "standard backward": "OOM", "flashattn forward": "ok", '
      '"flashattn backward": "ok"}}}}')
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    path = tmp_path / "ncu"
    path.write_text(FAKE_NCU.format(python=sys.executable, data=str(DATA), permission=PERMISSION_LOG))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_measure_with_ncu_runs_the_profile_and_both_imports(fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    kernels, status = measure_with_ncu(SHAPE, fake_ncu)
    assert len(kernels) == 14 and all(k.phase for k in kernels)
    assert status["standard backward"] == "OOM" and status["flashattn backward"] == "ok"


def test_measure_with_ncu_reports_a_permission_failure(fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "permission")
    with pytest.raises(NcuUnavailable, match="ERR_NVGPUCTRPERM"):
        measure_with_ncu(SHAPE, fake_ncu)


def test_a_pass_that_ran_without_profiled_kernels_is_refused():
    kernels = attribute_phases(parse_ncu_csv(DETAILS), parse_ncu_csv(DETAILS_NVTX))
    forward_only = [k for k in kernels if not k.phase.endswith("backward")]
    every_pass_ran = dict.fromkeys(("standard forward", "standard backward", "flashattn forward",
                                    "flashattn backward"), "ok")
    iomeasure.check_every_pass_profiled(kernels, every_pass_ran)
    with pytest.raises(NcuUnavailable, match="no kernel of the standard backward pass"):
        iomeasure.check_every_pass_profiled(forward_only, every_pass_ran)
    iomeasure.check_every_pass_profiled(forward_only, {**every_pass_ran, "standard backward": "OOM",
                                                       "flashattn backward": "OOM"})


def test_a_missing_ncu_executable_is_unavailable_not_a_crash(tmp_path):
    with pytest.raises(NcuUnavailable, match="cannot run"):
        measure_with_ncu(SHAPE, str(tmp_path / "no-such-ncu"))


# ---------------------------------------------------------------------------------------------
# Model against measurement, and the fallback
# ---------------------------------------------------------------------------------------------


def ncu_ok(shape, path):
    kernels = attribute_phases(parse_ncu_csv(DETAILS), parse_ncu_csv(DETAILS_NVTX))
    return kernels, {label: "ok" for label in ("standard forward", "standard backward", "flashattn forward",
                                               "flashattn backward")}


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
# The passes themselves (the CPU path stands in for the GPU; ranges are no-ops)
# ---------------------------------------------------------------------------------------------


def test_run_phases_runs_every_pass_in_its_range(torch_backend):
    import contextlib

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
    from flashattn import bench

    def out_of_memory(*args):
        def run():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return run

    monkeypatch.setitem(bench.PROVIDERS, "naive", out_of_memory)
    import contextlib

    status = run_phases(LayerShape(1, 16, 16, 1, 1, 16, "float32"), torch.device("cpu"),
                        lambda phase: contextlib.nullcontext())
    assert status == {"standard forward": "OOM", "standard backward": "OOM", "flashattn forward": "ok",
                      "flashattn backward": "ok"}


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    iomodel.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_measure_without_a_gpu_is_a_usage_error(capsys):
    assert iomodel.run(parse("--seqlen", "1024", "--measure")) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashattn io: error: argument --measure:") and "CUDA GPU" in err


@pytest.mark.parametrize("flag", ["--block-m", "--block-n"])
def test_measure_refuses_tile_overrides(flag, capsys):
    assert iomodel.run(parse("--seqlen", "1024", "--measure", flag, "64")) == 2
    assert f"argument {flag}: --measure runs the tiles" in capsys.readouterr().err


def test_measure_validates_the_shape_first(capsys):
    assert iomodel.run(parse("--measure")) == 2
    assert "argument --seqlen" in capsys.readouterr().err


def test_bad_measure_with_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("--seqlen", "64", "--measure", "--measure-with", "nsys")
    assert exit_info.value.code == 2 and "--measure-with" in capsys.readouterr().err


def test_measure_plumbing_with_the_gpu_faked(monkeypatch, capsys):
    """On a (faked) H100 without ncu: the H100 preset, the device's tiles, and the fallback in the JSON."""
    from flashattn import configs, measure

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(measure, "device_label", lambda device: "NVIDIA H100 80GB HBM3 (faked)")
    monkeypatch.setattr(configs, "gpu_family", lambda device: "hopper")
    monkeypatch.setattr(iomeasure, "find_ncu", lambda explicit=None: None)
    monkeypatch.setattr(iomeasure, "measure_with_profiler", profiler_times)
    monkeypatch.delenv("FLASHATTN_BACKEND", raising=False)
    assert iomodel.run(parse("--seqlen", "1024", "--heads", "4", "--head-dim", "64", "--measure", "--json")) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["gpu"]["name"] == "H100 (measured)"  # picked from the device's name
    assert data["tiling"]["forward"] == {"block_m": 128, "block_n": 64}  # configs' Hopper table, hdim 64
    assert data["measured"]["method"] == "profiler" and "not on PATH" in data["measured"]["fallback_reason"]
    assert "measuring on NVIDIA H100 80GB HBM3 (faked)" in captured.err
    assert iomodel.run(parse("--seqlen", "1024", "--heads", "4", "--head-dim", "64", "--measure")) == 0
    text = capsys.readouterr().out
    assert text.index("Attention IO:") < text.index("NOT A BYTE MEASUREMENT")


def test_measure_refuses_the_torch_backend(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    assert iomodel.run(parse("--seqlen", "1024", "--measure")) == 2
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
    assert iomodel.run(parse("--seqlen", "512", "--heads", "4", "--head-dim", "64", "--measure",
                             "--measure-with", "profiler", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    measured = data["measured"]
    assert measured["method"] == "profiler" and not measured["bytes_measured"]
    for entry in measured["passes"]:
        assert entry["status"] == "ok" and entry["seconds"] > 0 and entry["implied_bandwidth"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(iomeasure.find_ncu() is None, reason="needs Nsight Compute (ncu)")
def test_gpu_ncu_measure_reads_dram_bytes_or_says_why_not(capsys):
    assert iomodel.run(parse("--seqlen", "1024", "--heads", "4", "--head-dim", "64", "--measure", "--json")) == 0
    measured = json.loads(capsys.readouterr().out)["measured"]
    if measured["method"] == "profiler":  # no access to the counters: the reason must say so
        assert measured["fallback_reason"]
        return
    assert measured["bytes_measured"] is True
    # ncu starts every kernel from a cold L2, so each input byte comes from DRAM at least once: the reads
    # of the "L2 kept all" bracket are a floor for the measured reads (writes may still sit in L2 when the
    # kernel ends, so they have no floor); the no-reuse count is a ceiling (20% for sector granularity).
    for entry in measured["passes"]:
        if entry["implementation"] != "flashattn":
            continue
        assert entry["read_bytes"] >= 0.9 * entry["model_once_read_bytes"], entry
        assert entry["measured_bytes"] <= 1.2 * entry["model_bytes"], entry
    assert os.environ.get("FLASHATTN_BACKEND") != "torch"
