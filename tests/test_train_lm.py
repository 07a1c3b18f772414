"""benchmarks/train_lm.py: its split of the standard library is disjoint and deterministic, and a tiny run of each
attention (FP8 on the CPU is the reference path) writes finite loss curves of the expected shape."""

from __future__ import annotations

import json
import math

import benchmark_scripts
import pytest

TINY = "--layers 2 --d-model 128 --heads 1 --context 64 --batch 2 --steps 3 --eval-every 2 --eval-batches 1"


@pytest.fixture(scope="module")
def script():
    return benchmark_scripts.load("train_lm")


def written(folder, attention):
    """The one results file a run wrote to ``folder``: named after the machine (the GPU's where there is one, even for
    a run on its CPU)."""
    (path,) = folder.glob(f"*-train_{attention}.json")
    return path


def test_split_is_disjoint_and_deterministic(script):
    files = script.stdlib_files()
    assert files == sorted(files) == script.stdlib_files() and len(set(files)) == len(files)
    assert not any("site-packages" in f or "dist-packages" in f for f in files)
    validation = [f for f in files if script.is_validation(f)]
    assert 0 < len(validation) < len(files) / 5  # about a tenth of the files
    train_bytes, validation_bytes = script.corpus()
    assert len(train_bytes) > len(validation_bytes) > 0
    starts = script.validation_starts(validation_bytes, 4, 64)
    inputs, targets = script.windows(validation_bytes, starts, 64)
    assert inputs.shape == targets.shape == (4, 64) and (inputs[:, 1:] == targets[:, :-1]).all()


def test_tiny_runs_write_finite_curves(script, tmp_path, capsys):
    for attention in ("bf16", "fp8"):
        assert script.main([*TINY.split(), "--attention", attention, "--device", "cpu", "--out", str(tmp_path)]) == 0
    paths = [written(tmp_path, attention) for attention in ("bf16", "fp8")]
    for path, attention in zip(paths, ("bf16", "fp8"), strict=True):
        data = json.loads(path.read_text())
        assert data["environment"]["settings"]["attention"] == attention
        rows = data["results"]
        assert [row["step"] for row in rows] == [2, 3]  # every --eval-every steps, and after the last
        for row in rows:
            assert all(math.isfinite(row[key]) for key in ("train_loss", "validation_loss", "time_s"))
            assert row["validation_loss"] < 1.5 * math.log(256)  # near chance at the start, not diverged
    capsys.readouterr()
    script.main(["--plot", *map(str, paths), "--figure", str(tmp_path / "curves.png")])
    printed = capsys.readouterr().out
    assert "relative difference" in printed and (tmp_path / "curves.png").stat().st_size > 0


def test_a_run_cut_by_its_time_limit_goes_on_where_it_stopped(script, tmp_path):
    """--time-limit 0 stops at each evaluation; the same command resumes from --checkpoint (weights, optimizer, the
    batches' generator and the FP8 rotations' seeds), so the pieces give the uninterrupted run's losses exactly."""
    tiny = [*TINY.split(), "--steps", "2", "--eval-every", "1", "--attention", "fp8", "--device", "cpu"]
    assert script.main([*tiny, "--out", str(tmp_path / "whole")]) == 0
    cut = [*tiny, "--out", str(tmp_path / "cut"), "--checkpoint", str(tmp_path / "state.pt"), "--time-limit", "0"]
    assert [script.main(cut) for _ in range(2)] == [3, 0]
    whole, pieces = (json.loads(written(tmp_path / name, "fp8").read_text())["results"]
                     for name in ("whole", "cut"))
    assert len(whole) == 2 and [(r["train_loss"], r["validation_loss"]) for r in whole] == [
        (r["train_loss"], r["validation_loss"]) for r in pieces]
