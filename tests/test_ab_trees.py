"""benchmarks/ab_trees.py: its case words, its trees, and one round on the CPU."""

import pytest
from benchmark_scripts import load

ab_trees = load("ab_trees")


def test_cases_read_their_words():
    case = ab_trees.parse_case("decode d128 b4 c8192 h32/8 n1")
    assert (case.kind, case.head_dim, case.batch, case.capacity, case.heads, case.kv_heads, case.new_keys) == (
        "decode", 128, 4, 8192, 32, 8, 1)
    case = ab_trees.parse_case("varlen d64 l1000x3 h4 causal")
    assert (case.lengths, case.heads, case.kv_heads, case.causal) == ((1000, 1000, 1000), 4, 4, True)
    case = ab_trees.parse_case("fwd d128 b2 s1000 h8 causal w256 softcap alibi sliced")
    assert (case.window, case.softcap, case.alibi, case.causal, case.sliced) == (256, True, True, True, True)
    for text in ab_trees.DEFAULT_CASES:
        assert ab_trees.parse_case(text).text == text


@pytest.mark.parametrize("text, message", [("fwd d64 s128 x3", "unknown word 'x3'"), ("mlp d64 s128", "the kind"),
                                           ("fwd s128", "no head dim"), ("decode d64 b2", "needs capacity"),
                                           ("decode d64 c256 softcap", "takes no softcap"),
                                           ("varlen d64 l40x2 sliced", "takes no sliced")])
def test_bad_cases_name_the_word(text, message):
    with pytest.raises(ValueError, match=message):
        ab_trees.parse_case(text)


def test_a_revision_exports_its_sources(tmp_path):
    tree = ab_trees.source_tree("HEAD", tmp_path / "a")
    assert (tree / "src" / "flashattn" / "__init__.py").is_file()
    assert ab_trees.source_tree(str(ab_trees.ROOT), tmp_path / "b") == ab_trees.ROOT


def test_one_round_on_the_cpu(tmp_path, capsys):
    """Both sides this checkout's tree: every case in the table, with each side's rate and their ratio."""
    out = tmp_path / "rounds.json"
    cases = ["fwd d32 b1 s64 h2 sliced", "varlen d32 l40x2 h2 causal w16 softcap alibi", "decode d32 b1 c256 h4/2 n1"]
    assert ab_trees.main([str(ab_trees.ROOT), str(ab_trees.ROOT), "--device", "cpu", "--rounds", "1", "--cases",
                          *cases, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(cases)
    for line, case in zip(lines[2:], cases, strict=True):
        assert line.startswith(case)
        rate_a, rate_b, ratio = (float(x) for x in line[len(case):].split()[1:4])
        assert rate_a > 0 and rate_b > 0 and ratio == pytest.approx(rate_b / rate_a, abs=2e-3)
    assert out.is_file()
