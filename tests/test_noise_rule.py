"""benchmarks/noise_rule.py: the noise rule's classes, runs split over files, and its table."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import noise_rule  # noqa: E402


def _row(provider, head_dim, causal, seqlen, fwd, bwd):
    return {"provider": provider, "case": {"head_dim": head_dim, "causal": causal, "seqlen": seqlen},
            "fwd_tflops": fwd, "bwd_tflops": bwd, "error": None}


def _write(path, rows):
    path.write_text(json.dumps({"environment": {}, "results": rows}))
    return str(path)


@pytest.mark.parametrize("values, expected", [
    ([0.985, 0.97, 0.99], "met"),           # two runs at 0.98 of 1.0
    ([0.979, 0.97, 0.99], "floor"),         # one at the target; all three at 0.98 of the 0.95 floor (0.931)
    ([0.94, 0.935, 0.92], "floor"),
    ([0.92, 0.93, 0.95], "below"),          # only one at 0.931
    ([0.99, None, None], "short"),          # one run of three has the cell
    ([0.99, 0.99, None], "met"),
])
def test_classes_follow_two_runs_of_three(values, expected):
    assert noise_rule.classify(values, target=1.0, floor=0.95, tolerance=0.98) == expected


def test_two_thirds_of_the_runs_for_other_counts():
    assert [noise_rule.runs_needed(n) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 2, 3, 4, 4]


def test_a_split_run_is_merged_and_the_best_other_provider_taken(tmp_path, capsys):
    first = _write(tmp_path / "a.json", [_row("flashattn", 64, False, 1024, 99.0, 50.0),
                                         _row("fa4", 64, False, 1024, 100.0, 40.0),
                                         _row("sdpa_cudnn", 64, False, 1024, 90.0, 60.0)])
    second = _write(tmp_path / "b.json", [_row("flashattn", 64, True, 512, 80.0, 30.0),
                                          _row("fa4", 64, True, 512, 100.0, 30.0)])
    run = noise_rule.load_run(f"{first},{second}")
    assert set(run) == {(64, False, 1024), (64, True, 512)}
    assert noise_rule.ratio(run[(64, False, 1024)], "fwd_tflops", None) == pytest.approx(0.99)
    assert noise_rule.ratio(run[(64, False, 1024)], "bwd_tflops", None) == pytest.approx(50 / 60)
    assert noise_rule.ratio(run[(64, False, 1024)], "bwd_tflops", ("fa4",)) == pytest.approx(1.25)
    assert noise_rule.main([f"{first},{second}", first, first, "--directions", "fwd"]) == 0
    out = capsys.readouterr().out
    assert "| 64 | no |  | 0.990 / 0.990 / 0.990 met |" in out
    assert "| 64 | yes | 0.800 / - / - short |  |" in out
    assert "met: 1, floor: 0, below: 0, short: 1" in out


def test_an_unreadable_run_names_its_file(tmp_path):
    with pytest.raises(SystemExit):
        noise_rule.main([str(tmp_path / "missing.json")])
    with pytest.raises(ValueError, match="missing.json"):
        noise_rule.load_run(str(tmp_path / "missing.json"))
