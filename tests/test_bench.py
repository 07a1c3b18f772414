"""The benchmark tool on the CPU: it runs its small CPU grid, writes its results file, a table and a plot."""

import json
import re

import pytest
import torch

from flashattn.tools import bench, cli, timing


@pytest.fixture(autouse=True)
def short_cpu_timings(monkeypatch):
    """Runs stop after half a second even when a busy machine keeps them from settling: these tests check what is
    reported, not how fast."""
    monkeypatch.setattr(timing, "CPU_MAX_RUN_SECONDS", 0.5)


def test_cpu_bench_writes_results_and_checks_providers_against_flashattn(tmp_path, monkeypatch):
    # the CPU grid (float32) on any machine: a GPU's run is bf16, and the bench runs report it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    markdown = tmp_path / "table.md"
    code = bench.main(["--seqlens", "64", "--causal", "yes", "--providers", "flashattn", "sdpa_math", "naive",
                       "--out", str(tmp_path), "--markdown", str(markdown)])
    assert code == 0
    (results_path,) = tmp_path.glob("*.json")
    assert results_path.name == "cpu-dense.json"
    data = json.loads(results_path.read_text())
    assert data["environment"]["torch"] and data["environment"]["date"]
    rows = {r["provider"]: r for r in data["results"]}
    assert set(rows) == {"flashattn", "sdpa_math", "naive"}
    for provider in ("sdpa_math", "naive"):
        assert rows[provider]["error"] is None
        assert rows[provider]["max_diff_vs_flashattn"] < 1e-5  # same function, float32
    assert all(r["fwd_ms"] > 0 and r["bwd_ms"] > 0 for r in rows.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-dense.json", "table.md"]  # JSON only
    assert "| 64 |" in markdown.read_text()


def test_plot_from_results(tmp_path):
    pytest.importorskip("matplotlib")
    bench.main(["--seqlens", "64", "--causal", "no", "--modes", "fwd", "--providers", "flashattn", "naive",
                "--out", str(tmp_path), "--plot", str(tmp_path / "plot.png")])
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_fa4_provider_runs_where_flash_attn_4_imports(tmp_path, monkeypatch):
    """The ``fa4`` provider calls ``flash_attn.cute.flash_attn_func`` (which returns (out, lse)) and is checked against
    flashattn like the others; a stand-in module takes flash-attn-4's place, which has no CPU kernels."""
    import sys
    import types

    from flashattn import flash_attn_func

    calls = []

    def stand_in(q, k, v, causal=False):
        calls.append(causal)
        return flash_attn_func(q, k, v, causal=causal), None

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = stand_in
    package = types.ModuleType("flash_attn")
    package.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    assert bench.fa4_available()
    assert bench.main(["--seqlens", "64", "--causal", "yes", "--modes", "fwd", "--providers", "flashattn", "fa4",
                       "--out", str(tmp_path)]) == 0
    rows = {r["provider"]: r for r in json.loads(next(tmp_path.glob("*.json")).read_text())["results"]}
    assert rows["fa4"]["error"] is None and rows["fa4"]["max_diff_vs_flashattn"] == 0
    assert calls and all(calls)


def test_missing_provider_case_is_reported_not_fatal(tmp_path, monkeypatch):
    def broken(q, k, v, causal):
        raise RuntimeError("no kernel for this case")

    monkeypatch.setitem(bench.PROVIDERS, "naive", broken)
    assert bench.main(["--seqlens", "64", "--causal", "no", "--modes", "fwd", "--providers", "flashattn", "naive",
                       "--out", str(tmp_path)]) == 0
    (results_path,) = tmp_path.glob("*.json")
    rows = {r["provider"]: r for r in json.loads(results_path.read_text())["results"]}
    assert rows["naive"]["error"].startswith("RuntimeError: no kernel")


def test_varlen_providers_on_the_same_tokens(tmp_path):
    assert bench.main(["--seqlens", "64", "--causal", "yes", "--modes", "fwd", "--providers", "flashattn",
                       "--varlen", "--out", str(tmp_path)]) == 0
    (results_path,) = tmp_path.glob("*.json")
    assert results_path.name == f"{bench.machine_kind(bench.environment())}-varlen.json"
    rows = {r["provider"]: r for r in json.loads(results_path.read_text())["results"]}
    assert rows["flashattn_varlen"]["max_diff_vs_flashattn"] < 1e-5  # the dense batch, packed
    assert rows["flashattn_varlen_mixed"]["error"] is None
    assert rows["flashattn_varlen_mixed"]["max_diff_vs_flashattn"] is None  # another problem: not compared
    assert rows["flashattn_varlen_mixed"]["fwd_tflops"] > 0


def test_mixed_lengths_add_up():
    lengths = bench.mixed_lengths(1000, 64)
    assert sum(lengths) == 1000 and min(lengths) >= 1 and max(lengths) <= 127


def test_host_microseconds_counts_the_time_to_issue_each_call():
    """The host time per call of a function that sleeps 2 ms on the host: at least that, and not the warm-up's."""
    import time

    from flashattn.tools.bench import host_microseconds

    calls = []

    def slow_call():
        calls.append(None)
        time.sleep(0.002)

    us = host_microseconds(slow_call, torch.device("cpu"), calls=5)
    assert len(calls) == 6  # one warm-up call, then the five timed ones
    assert 2000 <= us < 20000


def test_a_run_replaces_the_results_file_of_its_mode(tmp_path):
    args = ["--seqlens", "64", "--causal", "no", "--modes", "fwd", "--providers", "flashattn", "--out", str(tmp_path)]
    assert bench.main([*args, "--head-dims", "32"]) == 0
    assert bench.main([*args, "--head-dims", "64"]) == 0
    (results_path,) = tmp_path.iterdir()
    rows = json.loads(results_path.read_text())["results"]
    assert {r["case"]["head_dim"] for r in rows} == {64}  # the second run's rows only


@pytest.mark.parametrize("device, kind", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA L40S", "l40s"), ("AMD Instinct MI300X", "mi300x"),
])
def test_machine_kind_from_the_gpu_name(device, kind):
    assert bench.machine_kind({"device": device, "capability": "9.0"}) == kind


def test_machine_kind_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.machine_kind(bench.environment()) == "cpu"


def test_a_head_dim_flashattn_refuses_is_a_usage_error_before_any_run(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--head-dims", "300"])
    assert exit_.value.code == 2
    output = capsys.readouterr()
    assert "argument --head-dims: head dim must be between 1 and 256, got 300" in output.err
    assert "ZeroDivisionError" not in output.out + output.err


def test_a_hidden_size_below_the_head_dim_is_a_usage_error(tmp_path, capsys):
    assert bench.main(["--head-dims", "128", "--hidden", "64", "--out", str(tmp_path)]) == 2
    assert "--hidden: 64 is smaller than head dim 128" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_results_go_to_the_current_directory_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--seqlens", "32", "--causal", "no", "--modes", "fwd", "--providers", "flashattn"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["cpu-dense.json"]
    assert f"results: {tmp_path / 'cpu-dense.json'}" in capsys.readouterr().out


def test_cpu_lines_give_every_figure_or_say_why_not(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--seqlens", "64", "--causal", "no", "--providers", "flashattn", "naive",
                       "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0]
    assert "matmul (1024^3 float32)" in header and "None" not in header
    assert float(re.search(r"matmul \S+ \S+ (\S+) TFLOP/s", header).group(1)) > 0
    rows = {line.split()[3]: line for line in lines[1:3]}
    for line in rows.values():
        assert "None" not in line and not re.search(r"\b0\.0\b", line), line
        assert line.count("±") == 2  # the forward's and the backward's spread
        rates = [float(x) for x in re.findall(r"(\S+) TFLOP/s", line)]
        assert len(rates) == 2 and all(rate > 0 for rate in rates)
        assert float(re.search(r"peak mem (\S+) MiB", line).group(1)) > 0
    assert "diff n/a (the reference)" in rows["flashattn"]
    assert re.search(r"diff \d\.\d\de-\d\d", rows["naive"])
    data = json.loads((tmp_path / "cpu-dense.json").read_text())
    for row in data["results"]:
        assert row["peak_extra_mib"] > 0 and row["fwd_spread"] >= 0 and row["fwd_settled"] in (True, False)


def test_the_commit_is_the_callers_where_named(monkeypatch):
    monkeypatch.setenv("FLASHATTN_COMMIT", "0123abc")
    assert bench.environment()["commit"] == "0123abc"
    monkeypatch.delenv("FLASHATTN_COMMIT")
    commit = bench._git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", commit)
