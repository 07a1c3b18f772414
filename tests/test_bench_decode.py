"""The decode mode of ``flashattn bench`` on the CPU: it runs its small grid, checks SDPA against
flashattn on the same cache, and writes its results file and a Markdown table."""

import json

import torch

from flashattn.tools import bench, timing
from flashattn.tools.bench_decode import DecodeCase, choose_grid_copies


def test_decode_mode_writes_results_and_agrees_with_sdpa(tmp_path, monkeypatch):
    # the CPU grid on any machine (a GPU's run has bf16 and every SDPA backend; the bench runs report it)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(timing, "CPU_MAX_RUN_SECONDS", 0.5)  # a busy machine's runs stop unsettled, soon
    markdown = tmp_path / "decode.md"
    code = bench.main(["--mode", "decode", "--batches", "2", "--cache-lens", "48", "--page-sizes", "16",
                       "--out", str(tmp_path), "--markdown", str(markdown)])
    assert code == 0
    (results_path,) = tmp_path.glob("*.json")
    assert results_path.name == "cpu-decode.json"
    rows = json.loads(results_path.read_text())["results"]
    by_key = {(r["provider"], r["case"]["page_size"]): r for r in rows}
    assert set(by_key) == {("flashattn", None), ("flashattn_nosplit", None), ("flashattn_noappend", None),
                           ("sdpa_math", None), ("flashattn", 16), ("flashattn_nosplit", 16),
                           ("flashattn_noappend", 16)}
    for row in rows:
        assert row["error"] is None and row["us"] > 0 and row["gbytes_per_s"] > 0
    # the step without the append attends to the same keys: the cache already holds the appended one
    for key in (("flashattn_nosplit", None), ("sdpa_math", None), ("flashattn_nosplit", 16),
                ("flashattn_noappend", None), ("flashattn_noappend", 16)):
        assert by_key[key]["extra"]["max_diff_vs_flashattn"] < 1e-5  # same attention, float32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-decode.json", "decode.md"]  # JSON only
    assert "| 48 | 2 | paged 16 |" in markdown.read_text()
    for row in rows:  # each time with its spread, as the dense bench and the demo give theirs
        assert row["spread"] >= 0 and row["settled"] in (True, False)


def test_decode_mode_writes_to_the_current_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(timing, "CPU_MAX_RUN_SECONDS", 0.5)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--mode", "decode", "--batches", "1", "--cache-lens", "32", "--page-sizes", "16"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["cpu-decode.json"]


def test_kv_bytes_and_cache_copies():
    case = DecodeCase(batch=4, cache_len=4096)  # 32/8 heads, head dim 128, bf16
    assert case.kv_bytes() == 2 * 4 * 4096 * 8 * 128 * 2
    assert choose_grid_copies(case.kv_bytes(), l2=50 << 20) == 4  # 4 x 50 MiB over 64 MiB per copy
    assert choose_grid_copies(case.kv_bytes(), l2=0) == 1
