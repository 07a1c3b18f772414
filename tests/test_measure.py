"""``flashattn memory --measure`` (``flashattn.measure``): one layer measured beside the model.

On the CPU the allocations come from torch.profiler's memory events, so the whole path runs here on
small shapes; the refusals (no GPU, dropout, a shape too large for the CPU) are usage errors (exit 2).
Bounds, for a layer without GQA in float32 (e = 4 bytes, S and P each B*H*N^2*e, q-sized B*N*H*D*e):
standard inference holds S and P at once (the model) plus at most the scaled copy of q; standard
training keeps P and the scaled q (half the model, plus a q); flashattn training keeps exactly its
log-sum-exp, the model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from flashattn.tools import bench, memory
from flashattn.tools import measure as layer
from flashattn.tools.measure import (
    CPU_MEASURE_LIMIT_BYTES,
    LayerShape,
    MemoryCell,
    measure_layer_memory,
    memory_notes,
    render_memory_table,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    memory.add_arguments(parser)
    return parser.parse_args(argv)


SMALL = ("--layers", "1", "--heads", "2", "--head-dim", "32", "--dtype", "float32")


def cells_by_key(cells):
    return {(c["seqlen"], c["mode"], c["implementation"]): c for c in cells}


def test_cpu_measure_matches_the_model_where_it_must(capsys, torch_backend):
    assert layer.run(parse(*SMALL, "--seqlens", "128", "384", "--measure", "cpu", "--json")) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert "measuring on cpu" in captured.err
    assert data["model"]["heads"] == 2 and data["dtype"] == "float32" and data["device"].startswith("cpu")
    cells = cells_by_key(data["measured"])
    assert len(cells) == 8  # 2 seqlens x 2 modes x 2 implementations
    for seqlen in (128, 384):
        scores = 2 * seqlen * seqlen * 4  # one of S, P
        q_bytes = seqlen * 2 * 32 * 4
        lse = 2 * seqlen * 4
        standard = cells[(seqlen, "inference", "standard")]
        assert standard["model_bytes"] == 2 * scores
        assert 2 * scores <= standard["measured_bytes"] <= 2 * scores + q_bytes
        trained = cells[(seqlen, "training", "standard")]
        assert scores <= trained["measured_bytes"] <= scores + q_bytes + 64  # P and the scaled q
        assert trained["ratio"] == pytest.approx(trained["measured_bytes"] / (2 * scores))
        assert trained["peak_bytes"] >= 2 * scores  # P and dP at least, at the backward's peak
        flash = cells[(seqlen, "training", "flashattn")]
        assert flash["model_bytes"] == lse and flash["measured_bytes"] == lse
        assert flash["peak_bytes"] is not None and flash["out_of_memory"] is None
        assert cells[(seqlen, "inference", "flashattn")]["peak_bytes"] is None
    assert any("eager autograd keeps P" in note for note in data["notes"])


def test_cpu_measure_prints_the_table(capsys, torch_backend):
    assert layer.run(parse(*SMALL, "--kv-heads", "1", "--seqlens", "64", "--measure", "cpu")) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("Attention memory of one layer, model against measurement on cpu")
    assert lines[1].split() == ["seqlen", "mode", "implementation", "model", "measured", "measured/model",
                                "peak", "fwd+bwd"]
    rows = [line.split()[:3] for line in lines[3:7]]
    assert rows == [["64", "inference", "standard"], ["64", "inference", "flashattn"],
                    ["64", "training", "standard"], ["64", "training", "flashattn"]]
    assert "GQA: standard attention also copies K and V" in out


def test_out_of_memory_is_a_cell_not_a_crash(monkeypatch, torch_backend):
    def out_of_memory(*args):
        def run():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return run

    monkeypatch.setitem(bench.PROVIDERS, "naive", out_of_memory)
    config = memory.ModelConfig("tiny", layers=1, heads=1, kv_heads=1, head_dim=16, hidden=16)
    cells = measure_layer_memory(config, 1, 32, "float32", torch.device("cpu"))
    standard = [c for c in cells if c.implementation == "standard"]
    assert [c.out_of_memory for c in standard] == ["forward", "forward"]
    assert all(c.measured_bytes is None and c.ratio is None for c in standard)
    assert all(c.measured_bytes is not None for c in cells if c.implementation == "flashattn")
    text = render_memory_table(config, 1, "float32", "cpu", cells, memory_notes(config, torch.device("cpu")))
    rows = [line.split() for line in text.splitlines() if line[:1].isdigit()]
    assert [row[5] for row in rows if row[2] == "standard"] == ["OOM", "OOM"]  # model "8.00 KiB" is 2 words


def test_a_backward_out_of_memory_keeps_the_forward_measurement():
    cell = MemoryCell(4096, "training", "standard", 100, measured_bytes=50, out_of_memory="backward")
    config = memory.ModelConfig("tiny", layers=1, heads=1, kv_heads=1, head_dim=16, hidden=16)
    line = render_memory_table(config, 1, "bf16", "gpu", [cell], []).splitlines()[3]
    assert line.split()[3:] == ["100", "B", "50", "B", "0.50x", "OOM"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_measure_without_a_gpu_is_a_usage_error(capsys):
    assert layer.run(parse("--model", "llama-2-7b", "--measure")) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashattn memory: error: argument --measure: needs a CUDA GPU")
    assert "--measure cpu" in err


def test_measure_cpu_refuses_shapes_too_large_for_the_cpu(capsys):
    assert layer.run(parse("--model", "llama-2-7b", "--seqlens", "1024", "8192", "--measure", "cpu")) == 2
    err = capsys.readouterr().err
    assert "argument --measure: seqlen 8192 needs 8.00 GiB" in err and "--seqlens" in err
    assert CPU_MEASURE_LIMIT_BYTES == 2 * 1024**3


def test_measure_refuses_dropout(capsys):
    assert layer.run(parse("--model", "llama-2-7b", "--dropout", "--measure", "cpu")) == 2
    assert "flashattn memory: error: --dropout: not measured" in capsys.readouterr().err


def test_measure_still_validates_the_model_flags(capsys):
    assert layer.run(parse("--model", "gpt-5", "--measure", "cpu")) == 2
    assert "--model" in capsys.readouterr().err


def test_bad_measure_device_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("--model", "llama-2-7b", "--measure", "tpu")
    assert exit_info.value.code == 2 and "--measure" in capsys.readouterr().err


def test_layer_shape_takes_dtype_aliases():
    assert LayerShape(1, 2, 2, 1, 1, 8, "bf16").torch_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        LayerShape(1, 2, 2, 1, 1, 8, "int8")


@pytest.mark.gpu
def test_gpu_measure_matches_the_model():
    # head dim 64: the forward uses no TMA workspace there, so flashattn's extra memory is its lse alone. In a process
    # of its own, as a user runs it: the caching allocator's counters are the process's, and in a test worker a
    # tensor of an earlier test freed inside a window would count against the call measured there, and standard
    # inference's lower bound below is exact
    command = [sys.executable, "-m", "flashattn", "memory", "--layers", "1", "--heads", "8", "--head-dim", "64",
               "--seqlens", "1024", "4096", "--measure", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    cells = cells_by_key(json.loads(result.stdout)["measured"])
    for seqlen in (1024, 4096):
        scores = 8 * seqlen * seqlen * 2
        q_bytes = seqlen * 8 * 64 * 2
        lse = 8 * seqlen * 4
        assert 2 * scores <= cells[(seqlen, "inference", "standard")]["measured_bytes"] <= 2 * scores + 2 * q_bytes
        assert lse <= cells[(seqlen, "inference", "flashattn")]["measured_bytes"] <= lse + 4096
        assert lse <= cells[(seqlen, "training", "flashattn")]["measured_bytes"] <= lse + 4096
        assert scores <= cells[(seqlen, "training", "standard")]["measured_bytes"] <= scores + 2 * q_bytes
        # flashattn's backward scratch is O(N): the delta rows and, where dQ is fused (sm90 from 1k tokens), dQ's
        # float32 accumulator (N x d, twice q's bytes), nothing N x N
        assert cells[(seqlen, "training", "flashattn")]["peak_bytes"] <= 4 * lse + 2 * q_bytes + 4096


@pytest.fixture
def one_thread():
    """One torch thread: the sizes allocated are the same, and a busy machine does not slow the test tenfold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cpu_path_memory_grows_at_most_as_the_length_and_stays_below_standard(torch_backend, one_thread):
    """From 1k tokens on, each doubling at most doubles flashattn's measured extra memory (its working set of
    tiles stops growing at BLOCK_M queries), and it stays below standard attention's, in inference and over a
    training step."""
    config = memory.ModelConfig("small", layers=1, heads=1, kv_heads=1, head_dim=16, hidden=16)
    measured = {}
    for seqlen in (1024, 2048, 4096):
        cells = {(c.mode, c.implementation): c
                 for c in measure_layer_memory(config, 1, seqlen, "float32", torch.device("cpu"))}
        for mode, figure in (("inference", "measured_bytes"), ("training", "peak_bytes")):
            flash, standard = (getattr(cells[(mode, name)], figure) for name in ("flashattn", "standard"))
            assert flash < standard, (seqlen, mode, flash, standard)
            measured[(seqlen, mode)] = flash
    for mode in ("inference", "training"):
        for seqlen in (1024, 2048):
            assert measured[(2 * seqlen, mode)] <= 2 * measured[(seqlen, mode)], (mode, seqlen, measured)


@pytest.mark.parametrize("option_name", ["plain", "causal", "window", "dropout", "causal-alibi-softcap"])
def test_cpu_path_is_exact_when_the_tiles_split_the_queries(torch_backend, monkeypatch, option_name):
    """The CPU path with query blocks of 16 rows (its tiles hold at least MIN_BLOCK_M queries and at most
    TILE_ELEMENTS scores): the same results as the reference, forward and backward, GQA included."""
    from cases import make_case

    from flashattn import cpu, flash_attn_func
    from flashattn.testing import check_against_reference

    monkeypatch.setattr(cpu, "TILE_ELEMENTS", 1)
    monkeypatch.setattr(cpu, "MIN_BLOCK_M", 16)
    assert cpu.block_m(1, 4) == 16
    for shape in [(1, 113, 203, 4, 2, 40), (2, 203, 113, 4, 4, 24)]:
        check_against_reference(make_case(shape, option_name, "cpu"), torch.float32, "cpu", flash_attn_func)
