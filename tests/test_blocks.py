"""``flashattn blocks`` on the CPU: its arguments, its no-GPU answer, its IO-model columns and its JSON.

The timings themselves need a GPU; here every run is the validation-only mode on a tiny shape with one
or two candidates, so that the file stays fast under the Triton interpreter.
"""

from __future__ import annotations

import json

import pytest
import torch

from flashattn.configs import TileConfig
from flashattn.tools import blocks, cli

HAS_CUDA = torch.cuda.is_available()
TINY = ["blocks", "--seqlen", "64", "--head-dim", "16", "--heads", "2", "--batch", "1"]


@pytest.mark.parametrize(("argv", "flag"), [
    (["blocks", "--seqlen", "0"], "--seqlen"),
    (["blocks", "--head-dim", "abc"], "--head-dim"),
    (["blocks", "--phase", "sideways"], "--phase"),
    (["blocks", "--dtype", "int8"], "--dtype"),
    (["blocks", "--candidates", "17x16x1x1"], "--candidates"),
    (["blocks", "--candidates", "16x16x3x1"], "--candidates"),
    (["blocks", "--candidates", "16x16x1"], "--candidates"),
    (["blocks", "--sms", "-4"], "--sms"),
])
def test_bad_arguments_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "flag"), [
    (["blocks", "--head-dim", "512", "--interpret-check"], "--head-dim"),
    (["blocks", "--plot", "sweep.pdf", "--interpret-check"], "--plot"),
])
def test_bad_values_exit_2_naming_the_flag(argv, flag, capsys):
    assert cli.main(argv) == 2
    assert f"argument {flag}" in capsys.readouterr().err


@pytest.mark.skipif(HAS_CUDA, reason="the no-GPU path")
def test_without_a_gpu_timings_are_refused_with_a_clear_message(monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("FLASHATTN_BACKEND", raising=False)
    assert cli.main([*TINY, "--candidates", "16x16x1x1"]) == 2
    err = capsys.readouterr().err
    assert "timings need a CUDA GPU" in err and "--interpret-check" in err


@pytest.mark.skipif(HAS_CUDA, reason="the no-GPU path")
def test_interpret_check_on_the_torch_backend_says_configs_are_ignored(torch_backend, capsys):
    assert cli.main([*TINY, "--candidates", "16x16x1x1", "--interpret-check"]) == 0
    out = capsys.readouterr().out
    assert "timings need a CUDA GPU" in out and "ignores tile configs" in out
    assert "16x16x1x1" in out and " ok" in out


def test_shared_memory_estimate_by_hand():
    # forward: q tile 128 x 128 held, K and V tiles 64 x 128 streamed 3 deep, bf16
    assert blocks.shared_memory_bytes("forward", (128, 64, 8, 3), 128, 2) == (128 + 2 * 3 * 64) * 128 * 2 == 131072
    # dK/dV: K and V 64 x 128 held, q and dO 64 x 128 streamed 2 deep
    assert blocks.shared_memory_bytes("dkdv", (64, 64, 4, 2), 128, 2) == (2 * 64 + 2 * 2 * 64) * 128 * 2 == 98304
    # head dim 16 is loaded as 32-wide tiles (padded_head_dim); fp32 doubles the bytes
    assert blocks.shared_memory_bytes("dq", (16, 16, 1, 1), 16, 4) == (2 * 16 + 2 * 16) * 32 * 4 == 8192


def test_estimate_by_hand():
    shape = blocks.Shape(batch=2, seqlen=64, heads=3, head_dim=16, dtype="bf16", causal=False)
    model = blocks.estimate("forward", (16, 16, 1, 1), shape, sms=12)
    kv_tensor = 2 * 3 * 64 * 16 * 2  # batch x heads x seqlen x head dim x bytes
    assert model.smem_bytes == (16 + 2 * 16) * 32 * 2 == 3072
    assert model.reread_factor == 4  # every one of the 4 query blocks reads all of K and V
    assert model.reread_bytes == 2 * 4 * kv_tensor
    assert model.programs == 4 * 2 * 3 and model.programs_per_sm == 2.0
    # causal: query block i reads keys up to its last row, (i + 1) x 16 of them: 160 rows of 64
    causal = blocks.estimate("forward", (16, 16, 1, 1), blocks.Shape(2, 64, 3, 16, "bf16", True), sms=12)
    assert causal.reread_factor == pytest.approx(160 / 64)
    # dK/dV streams q and dO (and the float32 lse and delta rows) once per key block: 64 / 32 = 2 times
    dkdv = blocks.estimate("dkdv", (16, 32, 1, 1), shape, sms=12)
    assert dkdv.reread_factor == 2 and dkdv.programs == 2 * 2 * 3


def test_accumulator_registers_by_hand():
    # forward, hdim 128: O accumulator 128 x 128 and scores 128 x 128 in fp32 over 8 warps (256 threads)
    assert blocks.accumulator_registers("forward", (128, 128, 8, 3), 128, 2) == (128 * 128 + 128 * 128) // 256 == 128
    # the same tile over 4 warps needs 256 registers a thread: more than the 255 there are
    assert blocks.accumulator_registers("forward", (128, 128, 4, 2), 128, 2) == 256
    # dK/dV: dk and dv 64 x 128, scores and dP 64 x 64, over 128 threads
    assert blocks.accumulator_registers("dkdv", (64, 64, 4, 2), 128, 2) == (2 * 64 * 128 + 2 * 64 * 64) // 128 == 192
    # dQ: dq 128 x 128, scores and dP 128 x 64; float32 inputs add a compensation tile for dq
    assert blocks.accumulator_registers("dq", (128, 64, 8, 3), 128, 2) == (128 * 128 + 2 * 128 * 64) // 256 == 128
    assert blocks.accumulator_registers("dq", (128, 64, 8, 3), 128, 4) == (2 * 128 * 128 + 2 * 128 * 64) // 256
    # head dim 40 is held as 64-wide tiles
    assert blocks.accumulator_registers("forward", (64, 64, 4, 3), 40, 2) == (64 * 64 + 64 * 64) // 128
    shape = blocks.Shape(batch=1, seqlen=256, heads=2, head_dim=128, dtype="bf16", causal=False)
    assert blocks.estimate("forward", (128, 128, 4, 2), shape, sms=132).accumulator_regs == 256


@pytest.mark.interpreter
def test_json_of_the_validation_sweep(triton_backend, capsys):
    argv = [*TINY, "--phase", "both", "--candidates", "16x16x1x1", "--interpret-check", "--json", "--sms", "8"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["timed"] is False and data["sms"] == 8
    assert data["shape"] == dict(batch=1, seqlen=64, heads=2, head_dim=16, dtype="bf16", causal=False)
    assert data["best"] == {"forward": None, "dkdv": None, "dq": None}  # no timings, no winner
    assert [r["phase"] for r in data["results"]] == ["forward", "dkdv", "dq"]
    for row in data["results"]:
        assert row["status"] == "ok", row
        assert row["config"] == "16x16x1x1" and row["ms"] is None and row["tflops"] is None and not row["best"]
        assert set(row) >= {"block_m", "block_n", "num_warps", "num_stages", "max_error", "smem_bytes",
                            "reread_bytes", "reread_factor", "programs", "programs_per_sm"}
    assert data["results"][0]["programs_per_sm"] == 4 * 2 / 8


def test_a_wrong_or_failing_candidate_is_reported_never_best(monkeypatch):
    import flashattn.interface

    shape = blocks.Shape(1, 32, 1, 16, "fp32", False)
    monkeypatch.setattr(flashattn.interface, "flash_attn_func", lambda q, k, v, causal: torch.zeros_like(q))
    rows = blocks.sweep(shape, {"forward": [(16, 16, 1, 1)]}, device="cpu", timed=False, sms=1)
    assert rows[0].status == "WRONG" and not rows[0].best

    def broken(q, k, v, causal):
        raise RuntimeError("out of resource: shared memory")

    monkeypatch.setattr(flashattn.interface, "flash_attn_func", broken)
    rows = blocks.sweep(shape, {"forward": [(16, 16, 1, 1)]}, device="cpu", timed=False, sms=1)
    assert rows[0].status == "RuntimeError" and rows[0].max_error is None


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [blocks.Row("forward", "128x64x8x3", 128, 64, 8, 3, "ok", 1e-3, 1.0, 500.0, 131072, 1, 32.0, 512, 3.9,
                       best=True),
            blocks.Row("forward", "64x64x4x3", 64, 64, 4, 3, "WRONG", 1.0, None, None, 98304, 1, 64.0, 1024, 7.8)]
    path = tmp_path / "sweep.png"
    blocks.plot_rows(rows, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_candidates_take_the_tma_and_hopper_flags():
    parsed = blocks.parse_candidates("128x64x4x3+tma, 64x64x4x2, 128x128x8x2+hopper+persistent")
    assert [c[:5] for c in parsed] == [(128, 64, 4, 3, True), (64, 64, 4, 2, False), (128, 128, 8, 2, False)]
    assert [blocks.candidate_label(c) for c in parsed] == ["128x64x4x3+tma", "64x64x4x2",
                                                           "128x128x8x2+hopper+persistent"]
    assert TileConfig(*parsed[2]) == TileConfig(128, 128, 8, 2, hopper=True, persistent=True)
    assert all(TileConfig(*blocks.parse_candidates(blocks.candidate_label(c))[0]) == TileConfig(*c)
               for c in blocks.CANDIDATES_256["dkdv"])


def test_dkdv_candidates_take_the_loop_flags():
    parsed = blocks.parse_candidates("64x64x4x2+every, 64x64x4x3+keyrows+every, 64x64x4x2+r200+keyrows")
    assert [TileConfig(*c) for c in parsed] == [
        TileConfig(64, 64, 4, 2, mask_every_block=True),
        TileConfig(64, 64, 4, 3, mask_every_block=True, key_rows=True),
        TileConfig(64, 64, 4, 2, max_registers=200, key_rows=True)]
    assert [blocks.candidate_label(c) for c in parsed] == [
        "64x64x4x2+every", "64x64x4x3+every+keyrows", "64x64x4x2+r200+keyrows"]


def test_a_dkdv_candidate_holds_two_accumulators():
    candidate = (32, 128, 8, 2)
    # dK and dV 128 x 256, scores and dP 32 x 128, over 256 threads
    assert blocks.accumulator_registers("dkdv", candidate, 256, 2) == (2 * 128 * 256 + 2 * 32 * 128) // 256


def test_a_candidate_takes_a_register_cap():
    parsed = blocks.parse_candidates("128x64x8x3+r128, 128x64x8x3+tma+r96")
    assert [c[:6] for c in parsed] == [(128, 64, 8, 3, False, 128), (128, 64, 8, 3, True, 96)]
    assert [blocks.candidate_label(c) for c in parsed] == ["128x64x8x3+r128", "128x64x8x3+tma+r96"]
    assert TileConfig(*parsed[0]) == TileConfig(128, 64, 8, 3, max_registers=128)
    with pytest.raises(Exception, match=r"register cap"):
        blocks.parse_candidates("128x64x8x3+r512")
    with pytest.raises(Exception, match=r"at most one register cap"):
        blocks.parse_candidates("128x64x8x3+r96+r128")


def test_an_unknown_candidate_flag_is_refused_by_name():
    with pytest.raises(Exception, match=r"unknown flag\(s\) \['fast'\]"):
        blocks.parse_candidates("128x64x4x3+fast")
