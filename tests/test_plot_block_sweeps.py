"""benchmarks/plot_block_sweeps.py: the H200 sweep files load, the model labels are right, and the figure
and the tables of docs/block-size.md come out."""

from __future__ import annotations

import benchmark_scripts
import pytest


@pytest.fixture(scope="module")
def script():
    return benchmark_scripts.load("plot_block_sweeps")


def test_the_sweeps_load_with_the_model_columns(script):
    points = script.load()
    assert len([p for p in points if p.seqlen == 4096]) == 52 + 80  # the two full sweeps
    assert len([p for p in points if p.seqlen == 16384]) == 14  # the two TMA sweeps, 7 configs each
    winner = next(p for p in points if p.phase == "forward" and p.head_dim == 128 and not p.causal
                  and p.config == "128x128x8x3")
    assert winner.smem_bytes == (128 + 2 * 3 * 128) * 128 * 2 and winner.accumulator_regs == 128
    assert winner.reread_factor == 32 and script.resident_programs(winner, "H200") == 1
    assert script.resident_programs(winner, "A100") == 0  # 224 KB: more than an A100 program may have
    too_big = next(p for p in points if p.phase == "dq" and p.head_dim == 256 and p.config == "128x64x8x2")
    assert too_big.status == "OutOfResources" and too_big.smem_bytes == 256 * 1024
    assert script.no_reuse_bound_tflops(winner, "H200", 4.23) == pytest.approx(128 * 4.23)
    assert script.no_reuse_bound_tflops(winner, "A100", 2.04) == pytest.approx(128 * 2.04)


def test_markdown_tables(script):
    text = script.markdown(script.load())
    assert "| 128x128x8x3 | 224 KB | 128 | 32x | 1 | 15.5 | 497 | 405 |" in text
    assert "| 128 | 128x128x8x3 | 224 KB | no | 0 | - | 198 / 261 | 497 |" in text
    assert "| 128x128x8x3+tma | 224 KB | 128 | 128x | 541 | 523 |" in text


def test_the_figure_is_written(script, tmp_path):
    pytest.importorskip("matplotlib")
    path = script.plot(script.load(), tmp_path / "sweeps.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
