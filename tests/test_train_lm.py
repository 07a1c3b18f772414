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
    paths = [tmp_path / f"cpu-train_{attention}.json" for attention in ("bf16", "fp8")]
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
