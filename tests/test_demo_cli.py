"""The demo and the command line: they run, they say PASS, and bad arguments are usage errors.

Fast on purpose (tiny sequence lengths, CPU only): the numbers themselves are the kernels' tests' job.
"""

from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
import types

import pytest
import torch

import flashattn
from flashattn.tools import bench, bench_decode, cli, demo, timing
from flashattn.tools.demo import run_demo
from flashattn.tools.timing import settle, settled_median


@pytest.fixture(autouse=True)
def short_cpu_timings(monkeypatch):
    """Runs stop after half a second even when a busy machine keeps them from settling: these tests check what is
    reported, not how fast."""
    monkeypatch.setattr(timing, "CPU_MAX_RUN_SECONDS", 0.5)


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m flashattn ARGS`` in a fresh interpreter: what a user types, __main__ included."""
    return subprocess.run([sys.executable, "-m", "flashattn", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_info_prints_the_version():
    result = run_module("info")
    assert result.returncode == 0, result.stderr
    assert flashattn.__version__ in result.stdout
    for label in ("torch", "triton", "device", "backend"):
        assert label in result.stdout


def test_info_reports_the_backend_override(monkeypatch, capsys):
    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    assert cli.main(["info"]) == 0
    assert "forced by FLASHATTN_BACKEND=torch" in capsys.readouterr().out


def test_info_json_has_the_same_fields(monkeypatch, capsys):
    import json

    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["flashattn"] == flashattn.__version__ and data["FLASHATTN_BACKEND"] == "torch"
    assert set(data) >= {"python", "torch", "triton", "device", "backend"}


def test_run_demo_on_cpu_passes(capsys):
    run_demo(device="cpu", seqlens=[64, 128], heads=2)
    out = capsys.readouterr().out
    table_rows = [line for line in out.splitlines() if line.lstrip("│ ").startswith(("64 ", "128 "))]
    assert sum("PASS" in line for line in table_rows) == 2, out
    assert "FAIL" not in out
    assert "exact: max error" in out and "within the dtype tolerance" in out
    assert "O(N) vs O(N^2)" in out


def test_demo_subcommand_runs(capsys):
    argv = ["demo", "--device", "cpu", "--seqlens", "32,64", "--heads", "1", "--headdim", "16",
            "--threads", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "FAIL" not in out


@pytest.mark.parametrize("argv", [
    [],                                  # no subcommand
    ["nosuchcommand"],
    ["demo", "--seqlens", "0"],
    ["demo", "--seqlens", "abc"],
    ["demo", "--dtype", "int8"],
    ["demo", "--device", "tpu"],
    ["demo", "--heads", "-1"],
    ["demo", "--threads", "0"],
    ["info", "--unknown-flag"],
])
def test_bad_arguments_exit_with_code_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_bad_arguments_exit_with_code_2_from_the_command_line(monkeypatch, capsys):
    """``python -m flashattn demo --batch zero``, __main__ run in this interpreter (test_info_prints_the_version
    starts a fresh one)."""
    monkeypatch.setattr(sys, "argv", ["flashattn", "demo", "--batch", "zero"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("flashattn", run_name="__main__")
    assert exit_.value.code == 2
    assert "--batch" in capsys.readouterr().err


def test_bench_is_registered_when_its_module_has_the_hooks(monkeypatch):
    ran: list[argparse.Namespace] = []
    bench = types.ModuleType("flashattn.tools.bench")
    bench.__doc__ = "Benchmark the kernels."
    bench.add_arguments = lambda parser: parser.add_argument("--repeats", type=int, default=1)
    bench.run = lambda args: ran.append(args) or 0
    monkeypatch.setitem(sys.modules, "flashattn.tools.bench", bench)
    assert cli.main(["bench", "--repeats", "3"]) == 0
    assert ran[0].repeats == 3


def test_bench_is_skipped_when_its_module_lacks_the_hooks(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashattn.tools.bench", types.ModuleType("flashattn.tools.bench"))
    assert "bench" not in cli.all_subcommands()


def _rounds(medians):
    """A measure_round that returns the given medians in turn and records which rounds were asked for."""
    asked = []

    def measure_round(round_index):
        asked.append(round_index)
        return medians[round_index]

    return measure_round, asked


def test_settled_median_stops_at_the_first_agreeing_pair_and_takes_its_faster_round():
    measure_round, asked = _rounds([1.40, 1.00, 1.01, 0.50])
    assert settled_median(measure_round, tolerance=0.02) == 1.00
    assert asked == [0, 1, 2]


def test_settled_median_without_agreement_takes_the_median_of_the_rounds():
    measure_round, asked = _rounds([1.0, 1.5, 1.2, 2.0, 0.9])
    assert settled_median(measure_round, max_rounds=5, tolerance=0.02) == 1.2
    assert asked == [0, 1, 2, 3, 4]


def test_settle_reports_the_spread_and_whether_the_rounds_agreed():
    measure_round, _ = _rounds([1.40, 1.00, 1.01])
    agreed = settle(measure_round, tolerance=0.02)
    assert agreed.settled and agreed.seconds == 1.00 and agreed.spread == pytest.approx(0.01)
    measure_round, _ = _rounds([1.0, 1.5, 1.2, 2.0, 0.9])
    never = settle(measure_round, max_rounds=5, tolerance=0.02)
    assert not never.settled and never.seconds == 1.2 and never.spread == pytest.approx(1.1 / 1.2)
    assert never.describe().endswith("unsettled")


def test_time_loop_divides_each_round_by_its_calls(monkeypatch):
    """Loop timing (the decode benchmark's eager steps): each round is ``calls`` calls by the wall clock, after ten
    warm-up calls, and a round is its wall time over its calls."""
    clock = iter(range(0, 10_000, 50))  # every perf_counter reading 50 s after the last: each round reads it twice
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    calls = []
    result = timing.time_loop(lambda: calls.append(1), torch.device("cpu"), calls=25)
    assert result.seconds == 50 / 25 and result.settled and result.runs == 2
    assert len(calls) == 10 + 2 * 25


def test_cpu_timing_repeats_the_call_and_keeps_its_spread():
    import time

    calls = []

    def sleep_2ms():
        calls.append(None)
        time.sleep(0.002)

    measured = timing.time_call(sleep_2ms, torch.device("cpu"))
    assert 0.002 <= measured.seconds < 0.05
    assert measured.runs >= 3 and len(calls) > measured.runs  # a warm-up and the block-size estimate too
    assert measured.spread >= 0 and "±" in measured.describe()


def test_demo_and_bench_time_with_the_same_helper():
    assert demo.time_call is bench.time_call is bench_decode.time_call is timing.time_call
    assert bench.PROVIDERS["naive"] is demo.standard_attention  # and compare against the same standard attention


def test_demo_times_carry_their_spread(capsys):
    run_demo(device="cpu", seqlens=[32], heads=1, headdim=16, threads=1)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("32 "))
    assert row.count("±") == 2, row  # the time of each path
    assert "interquartile range" in out
