"""The IO model (``flashattn.iomodel``): byte and FLOP counts checked against cases worked by hand.

Sizes are kept tiny so that every expected number can be derived in a comment. Notation: B batch,
H query heads, Hk kv heads, Sq/Sk sequence lengths, D head dim, e = 2 bytes (bf16), "row" = one
head-dim row of a tensor = D * e bytes; lse and delta rows are float32 (4 bytes).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest
import torch

from flashattn import configs
from flashattn.masks import visible
from flashattn.tools.iomodel import (
    GPU_PRESETS,
    AttentionProblem,
    BlockShape,
    Gpu,
    InvalidArgument,
    Tiling,
    add_arguments,
    analyze,
    asymptotic,
    backward_flops,
    flashattn_backward_bytes,
    flashattn_backward_flops_executed,
    flashattn_forward_bytes,
    forward_flops,
    hopper_block_shape,
    keys_loaded_per_query_block,
    query_rows_loaded_per_key_block,
    roofline,
    run,
    standard_backward_bytes,
    standard_backward_flops_executed,
    standard_forward_bytes,
    standard_forward_flops_executed,
)


def problem(batch=1, seqlen_q=256, seqlen_k=256, heads=1, kv_heads=1, head_dim=64, dtype_bytes=2,
            causal=False) -> AttentionProblem:
    return AttentionProblem(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype_bytes, causal)


# The hand-worked case: B 1, H 1, Sq = Sk = 256, D 64, bf16, block_m 128, block_n 64 in every kernel.
# One row = 64 * 2 = 128 B; a whole q (or k, v, o) = 256 rows = 32768 B; an Sq x Sk matrix = 65536 * 2 = 131072 B.
SMALL = problem()
SMALL_TILES = Tiling.uniform(128, 64)


def by_key(transfers) -> dict[tuple[str, str, str], int]:
    return {(t.kernel, t.tensor, t.access): t.nbytes for t in transfers}


def total(transfers) -> int:
    return sum(t.nbytes for t in transfers)


# ---------------------------------------------------------------------------------------------
# flashattn: the hand-worked non-causal case
# ---------------------------------------------------------------------------------------------


def test_flashattn_forward_small_case():
    # 2 query blocks of 128 rows; each streams all 256 keys: 512 key rows of K and of V = 512 * 128 = 65536 B.
    # q read once and o written once: 32768 B each; lse: 256 rows * 4 B = 1024 B.
    # total = 2 * 32768 + 2 * 65536 + 1024 = 197632
    transfers = flashattn_forward_bytes(SMALL, SMALL_TILES)
    assert by_key(transfers) == {
        ("forward", "q", "read"): 32768,
        ("forward", "k", "read"): 65536,
        ("forward", "v", "read"): 65536,
        ("forward", "o", "write"): 32768,
        ("forward", "lse", "write"): 1024,
    }
    assert total(transfers) == 197632
    # with perfect L2 reuse K and V would move once: 32768 each
    assert sum(t.once_nbytes for t in transfers) == 4 * 32768 + 1024


def test_flashattn_backward_small_case():
    # delta: reads o and do (32768 each), writes 256 float32 rows (1024).                        = 66560
    # dkdv: 4 key blocks of 64; each loads k, v once (32768 each over all blocks) and all 256 query
    #   rows of q and do: 4 * 256 = 1024 rows = 131072 B each; lse and delta 1024 rows * 4 = 4096 each;
    #   writes dk, dv (32768 each).            4 * 32768 + 2 * 131072 + 2 * 4096                 = 401408
    # dq: q, do read once (32768 each), lse/delta (1024 each), 2 query blocks x 256 keys = 512 rows
    #   of k and of v (65536 each), writes dq (32768).   3 * 32768 + 2 * 1024 + 2 * 65536         = 231424
    transfers = flashattn_backward_bytes(SMALL, SMALL_TILES)
    assert by_key(transfers) == {
        ("delta", "o", "read"): 32768,
        ("delta", "do", "read"): 32768,
        ("delta", "delta", "write"): 1024,
        ("dkdv", "k", "read"): 32768,
        ("dkdv", "v", "read"): 32768,
        ("dkdv", "q", "read"): 131072,
        ("dkdv", "do", "read"): 131072,
        ("dkdv", "lse", "read"): 4096,
        ("dkdv", "delta", "read"): 4096,
        ("dkdv", "dk", "write"): 32768,
        ("dkdv", "dv", "write"): 32768,
        ("dq", "q", "read"): 32768,
        ("dq", "do", "read"): 32768,
        ("dq", "lse", "read"): 1024,
        ("dq", "delta", "read"): 1024,
        ("dq", "k", "read"): 65536,
        ("dq", "v", "read"): 65536,
        ("dq", "dq", "write"): 32768,
    }
    assert total(transfers) == 66560 + 401408 + 231424 == 699392


def test_a_split_dkdv_kernel_reads_k_q_do_and_the_lse_in_both_passes():
    split = replace(SMALL_TILES, dkdv=BlockShape(128, 64, passes=2))
    one_pass, two_passes = by_key(flashattn_backward_bytes(SMALL, SMALL_TILES)), by_key(
        flashattn_backward_bytes(SMALL, split))
    for tensor in ("k", "q", "do", "lse"):
        assert two_passes[("dkdv", tensor, "read")] == 2 * one_pass[("dkdv", tensor, "read")]
    for key in (("dkdv", "v", "read"), ("dkdv", "delta", "read"), ("dkdv", "dk", "write"), ("dkdv", "dv", "write")):
        assert two_passes[key] == one_pass[key]
    second_k_read = next(t for t in flashattn_backward_bytes(SMALL, split) if t.kernel == "dkdv" and t.tensor == "k")
    assert second_k_read.term == "reread" and second_k_read.once_nbytes == 32768
    # S is computed in both passes: 8 matmuls for the forward's 2
    assert flashattn_backward_flops_executed(SMALL, split) == 16777216 * 4
    assert flashattn_backward_flops_executed(SMALL, SMALL_TILES) == flashattn_backward_flops_executed(SMALL)
    with pytest.raises(InvalidArgument) as error:
        BlockShape(64, 64, passes=3)
    assert error.value.field == "passes"


# ---------------------------------------------------------------------------------------------
# Standard attention: the N^2 terms
# ---------------------------------------------------------------------------------------------


def test_standard_forward_small_case():
    # q, k, v read and o written once: 4 * 32768; S written, S read, P written, P read: 4 * 131072.
    # total = 131072 + 524288 = 655360
    transfers = standard_forward_bytes(SMALL)
    assert total(transfers) == 655360
    assert sum(t.nbytes for t in transfers if t.term == "quadratic") == 4 * 131072
    assert {t.tensor for t in transfers if t.term == "quadratic"} == {"S", "P"}


def test_standard_backward_small_case():
    # Sq x Sk traffic: P read twice (dV, softmax bwd), dP written and read, dS written and read twice: 7 * 131072.
    # linear: do read twice, q, k, v read, dq, dk, dv written: 8 * 32768.
    # total = 917504 + 262144 = 1179648
    transfers = standard_backward_bytes(SMALL)
    assert sum(t.nbytes for t in transfers if t.term == "quadratic") == 7 * 131072
    assert sum(t.nbytes for t in transfers if t.term == "linear") == 8 * 32768
    assert total(transfers) == 1179648


@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_standard_quadratic_terms_do_not_depend_on_head_dim_or_mask(head_dim):
    # B 2, H 3, Sq 100, Sk 300: one matrix = 2 * 3 * 100 * 300 * 2 B = 360000 B
    for causal in (False, True):
        p = problem(batch=2, heads=3, kv_heads=3, seqlen_q=100, seqlen_k=300, head_dim=head_dim, causal=causal)
        forward = standard_forward_bytes(p)
        backward = standard_backward_bytes(p)
        assert sum(t.nbytes for t in forward if t.term == "quadratic") == 4 * 360000
        assert sum(t.nbytes for t in backward if t.term == "quadratic") == 7 * 360000


def test_flashattn_has_no_quadratic_term():
    for transfers in (flashattn_forward_bytes(SMALL, SMALL_TILES), flashattn_backward_bytes(SMALL, SMALL_TILES)):
        assert all(t.term != "quadratic" for t in transfers)


# ---------------------------------------------------------------------------------------------
# Causal: halving at block granularity
# ---------------------------------------------------------------------------------------------


def test_causal_forward_visits_keys_up_to_the_diagonal_block():
    # query block 0 (rows 0..127): keys up to 127 -> 2 key blocks = 128 keys; block 1: all 256.
    # 384 key rows instead of 512 (3/4, not 1/2: the diagonal blocks are loaded whole).
    p = problem(causal=True)
    assert keys_loaded_per_query_block(p, BlockShape(128, 64)) == [128, 256]
    by = by_key(flashattn_forward_bytes(p, SMALL_TILES))
    assert by[("forward", "k", "read")] == by[("forward", "v", "read")] == 384 * 128
    assert total(flashattn_forward_bytes(p, SMALL_TILES)) == 2 * 32768 + 2 * 49152 + 1024 == 164864


def test_causal_dkdv_starts_at_the_first_query_block_that_sees_the_keys():
    # key blocks start at 0, 64, 128, 192; the first query that sees key s is row s, rounded down to a
    # 128-row block: 0, 0, 128, 128 -> query rows 256, 256, 128, 128 = 768 (non-causal: 1024).
    p = problem(causal=True)
    assert query_rows_loaded_per_key_block(p, BlockShape(128, 64)) == [256, 256, 128, 128]
    by = by_key(flashattn_backward_bytes(p, SMALL_TILES))
    assert by[("dkdv", "q", "read")] == by[("dkdv", "do", "read")] == 768 * 128
    assert by[("dkdv", "lse", "read")] == 768 * 4
    assert by[("dq", "k", "read")] == 384 * 128  # the dQ kernel walks keys as the forward does


def test_causal_block_counts_at_ragged_and_unequal_lengths():
    # Sq = Sk = 200: block 1 (rows 128..199) needs keys up to 199; its last key block (192..255) is cut at 200.
    assert keys_loaded_per_query_block(problem(seqlen_q=200, seqlen_k=200, causal=True), BlockShape(128, 64)) \
        == [128, 200]
    assert keys_loaded_per_query_block(problem(seqlen_q=200, seqlen_k=200), BlockShape(128, 64)) == [200, 200]
    # Sq 128 < Sk 256: bottom-right aligned, row i sees keys <= i + 128: blocks need keys up to 191, 255.
    assert keys_loaded_per_query_block(problem(seqlen_q=128, seqlen_k=256, causal=True), BlockShape(64, 64)) \
        == [192, 256]
    # its dK/dV: key block s is first seen by row s - 128 -> 0, 0, 0, 64: rows 128, 128, 128, 64.
    assert query_rows_loaded_per_key_block(problem(seqlen_q=128, seqlen_k=256, causal=True), BlockShape(64, 64)) \
        == [128, 128, 128, 64]
    # Sq 256 > Sk 128: rows below 128 see no key at all (their blocks load nothing).
    assert keys_loaded_per_query_block(problem(seqlen_q=256, seqlen_k=128, causal=True), BlockShape(64, 64)) \
        == [0, 0, 64, 128]


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(256, 256), (200, 200), (100, 333), (333, 100), (1, 77), (64, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_counts_match_the_mask(seqlen_q, seqlen_k, causal):
    """A block is loaded exactly when some (query, key) pair in it is visible (flashattn.masks.visible)."""
    block = BlockShape(32, 16)
    p = problem(seqlen_q=seqlen_q, seqlen_k=seqlen_k, causal=causal)
    seen = visible(torch.arange(seqlen_q)[:, None], torch.arange(seqlen_k)[None, :], seqlen_q, seqlen_k,
                   -1, 0 if causal else -1).expand(seqlen_q, seqlen_k)  # unmasked, it depends on the key alone

    def rows(start, block_size, limit):
        return min(start + block_size, limit) - start

    expected_keys = [
        sum(rows(n, block.block_n, seqlen_k) for n in range(0, seqlen_k, block.block_n)
            if seen[m:m + block.block_m, n:n + block.block_n].any())
        for m in range(0, seqlen_q, block.block_m)
    ]
    expected_rows = [
        sum(rows(m, block.block_m, seqlen_q) for m in range(0, seqlen_q, block.block_m)
            if seen[m:m + block.block_m, n:n + block.block_n].any())
        for n in range(0, seqlen_k, block.block_n)
    ]
    assert keys_loaded_per_query_block(p, block) == expected_keys
    assert query_rows_loaded_per_key_block(p, block) == expected_rows


# ---------------------------------------------------------------------------------------------
# GQA
# ---------------------------------------------------------------------------------------------


def test_gqa_reads_kv_once_per_query_head_except_in_dkdv():
    # B 2, H 4, Hk 2 (groups of 2), Sq = Sk = 256, D 64, tiles 128 x 64.
    p = problem(batch=2, heads=4, kv_heads=2)
    mha = problem(batch=2, heads=4, kv_heads=4)
    forward = by_key(flashattn_forward_bytes(p, SMALL_TILES))
    backward = by_key(flashattn_backward_bytes(p, SMALL_TILES))
    # forward: 8 (batch, query head) programs x 512 key rows x 128 B = 524288, the same as without GQA
    assert forward[("forward", "k", "read")] == 8 * 512 * 128 == 524288
    assert forward[("forward", "k", "read")] == \
        by_key(flashattn_forward_bytes(mha, SMALL_TILES))[("forward", "k", "read")]
    # dkdv: 4 (batch, kv head) programs read k once: 4 * 256 rows * 128 B; dk written per kv head alike
    assert backward[("dkdv", "k", "read")] == backward[("dkdv", "dk", "write")] == 4 * 256 * 128 == 131072
    # ... and walk both query heads of the group: 4 kv heads x 2 x 1024 rows x 128 B
    assert backward[("dkdv", "q", "read")] == 4 * 2 * 1024 * 128 == 1048576
    # dq: per query head, like the forward
    assert backward[("dq", "k", "read")] == 524288
    # once-bytes of a re-read K are the kv tensor itself: B * Hk * Sk rows
    k_transfer = next(t for t in flashattn_forward_bytes(p, SMALL_TILES) if t.tensor == "k")
    assert k_transfer.once_nbytes == 2 * 2 * 256 * 128
    # standard: K read per query head (broadcast)
    assert by_key(standard_forward_bytes(p))[("S = Q K^T", "k", "read")] == 8 * 256 * 128


# ---------------------------------------------------------------------------------------------
# FLOPs, intensity, roofline
# ---------------------------------------------------------------------------------------------


def test_flops_conventions_and_executed_counts():
    # forward: 4 * 256 * 256 * 64 = 16777216; backward 2.5x = 41943040; flashattn executes 3.5x = 58720256
    assert forward_flops(SMALL) == 16777216
    assert backward_flops(SMALL) == 41943040
    assert flashattn_backward_flops_executed(SMALL) == 58720256
    # standard: 4 matmuls on the whole matrix, masked or not
    assert standard_backward_flops_executed(SMALL) == 2 * 16777216
    causal = problem(causal=True)
    assert forward_flops(causal) == 8388608
    assert backward_flops(causal) == 20971520
    assert flashattn_backward_flops_executed(causal) == 29360128
    assert standard_forward_flops_executed(causal) == 16777216


def test_roofline_picks_the_longer_floor():
    gpu = Gpu("toy", peak_flops=100.0, bandwidth=10.0)  # ridge: 10 FLOP/B
    compute = roofline(1000, 50, gpu)  # 10 s of math, 5 s of bytes
    assert (compute.bound, compute.seconds, compute.intensity) == ("compute", 10.0, 20.0)
    memory = roofline(100, 50, gpu)  # 1 s of math, 5 s of bytes
    assert (memory.bound, memory.seconds, memory.intensity) == ("memory", 5.0, 2.0)
    assert gpu.ridge_intensity == 10.0
    assert GPU_PRESETS["h200"].ridge_intensity == pytest.approx(788 / 4.23)
    assert GPU_PRESETS["h100"].bandwidth == 3.02e12


def test_analyze_small_case_is_memory_bound_with_executed_flops():
    report = analyze(SMALL, SMALL_TILES, GPU_PRESETS["h200"])
    assert report.flashattn_forward.nbytes == 197632
    assert report.flashattn_forward.roofline.intensity == pytest.approx(16777216 / 197632)
    assert report.flashattn_backward.flops_executed == 58720256
    assert report.flashattn_backward.flops_convention == 41943040
    assert report.standard_forward.nbytes == 655360
    # 85 FLOP/B and less, under the H200's ridge of 186: every pass memory-bound
    for pass_report in (report.standard_forward, report.flashattn_forward, report.standard_backward,
                        report.flashattn_backward):
        assert pass_report.roofline.bound == "memory"
        assert pass_report.roofline.seconds == pytest.approx(pass_report.nbytes / 4.23e12)


def test_roofline_turns_compute_bound_at_long_sequences_with_a_fast_memory():
    # 16k keys, hdim 128, tiles 128 x 128: the K/V re-reads dominate the bytes, so the forward's intensity is
    # about 4 Sq Sk D / (2 (Sq / BLOCK_M) Sk D e) = 2 BLOCK_M / e = 128 FLOP/B: above the ridge of a GPU
    # with 800 TFLOP/s and 100 TB/s (8 FLOP/B), below that of one with 1 TB/s (800 FLOP/B).
    p = problem(seqlen_q=16384, seqlen_k=16384, head_dim=128)
    tiles = Tiling.uniform(128, 128)
    fast = analyze(p, tiles, Gpu("fast memory", 800e12, 100e12))
    slow = analyze(p, tiles, Gpu("slow memory", 800e12, 1e12))
    assert fast.flashattn_forward.roofline.bound == "compute"
    assert slow.flashattn_forward.roofline.bound == "memory"


# ---------------------------------------------------------------------------------------------
# The paper's asymptotic forms
# ---------------------------------------------------------------------------------------------


def test_asymptotic_forms_and_the_map_from_the_exact_count():
    # M = 64 KB = 32768 bf16 elements -> the paper's BLOCK_M = M / (4 d) = 32768 / 256 = 128, our tile.
    # standard Theta(N d + N^2) = ((256 + 256) * 64 + 256 * 256) * 2 B = 196608
    # tiled Theta(N^2 d^2 / M) = 256^2 * 64^2 / 32768 * 2 B = 16384
    # exact K+V re-reads: 2 * (256 / 128) * 256 * 64 * 2 B = 131072 = 8 * 16384
    a = asymptotic(SMALL, SMALL_TILES, sram_kb=64)
    assert a.sram_elements == 32768
    assert a.paper_block_m == 128
    assert a.standard_theta_bytes == 196608
    assert a.tiled_theta_bytes == 16384
    assert a.exact_kv_reread_bytes == 131072
    assert a.kv_reread_bytes_at_paper_block_m == 8 * a.tiled_theta_bytes == a.exact_kv_reread_bytes


# ---------------------------------------------------------------------------------------------
# The tile table
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["forward", "dkdv", "dq"])
@pytest.mark.parametrize("head_dim", [40, 64, 96, 128, 256])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hopper_accessor_agrees_with_tile_config(monkeypatch, phase, head_dim, masked, dtype):
    monkeypatch.setattr(configs, "gpu_family", lambda device: "hopper")
    expected = configs.tile_config(phase, head_dim, masked, dtype, torch.device("cpu"), interpret=False)
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    assert hopper_block_shape(phase, head_dim, masked, dtype_bytes) == BlockShape(expected.block_m, expected.block_n)


def test_tiling_from_the_table_and_overrides():
    tiling = Tiling.from_hopper_table(128, causal=False, dtype_bytes=2)
    assert tiling == Tiling(BlockShape(128, 128), BlockShape(64, 64), BlockShape(128, 64))
    causal_forward = configs.HOPPER_FORWARD.base[(128, True)]  # the table changes with sweeps; agreement is the point
    assert Tiling.from_hopper_table(128, causal=True, dtype_bytes=2).forward == BlockShape(
        causal_forward.block_m, causal_forward.block_n)
    overridden = tiling.with_overrides(block_n=32)
    assert overridden == Tiling(BlockShape(128, 32), BlockShape(64, 32), BlockShape(128, 32))
    with pytest.raises(InvalidArgument) as error:
        Tiling.from_hopper_table(512, causal=False, dtype_bytes=2)
    assert error.value.field == "head_dim"


@pytest.mark.parametrize("kwargs,field", [
    (dict(heads=4, kv_heads=3), "kv_heads"),
    (dict(seqlen_q=0), "seqlen_q"),
    (dict(head_dim=-1), "head_dim"),
])
def test_problem_validation_names_the_field(kwargs, field):
    with pytest.raises(InvalidArgument) as error:
        problem(**kwargs)
    assert error.value.field == field


@pytest.mark.parametrize("block_m,block_n,field", [(48, 64, "block_m"), (64, 8, "block_n")])
def test_block_shape_validation(block_m, block_n, field):
    with pytest.raises(InvalidArgument) as error:
        BlockShape(block_m, block_n)
    assert error.value.field == field


# ---------------------------------------------------------------------------------------------
# The command line: table, JSON, errors
# ---------------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flashattn io")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_run_prints_the_side_by_side_table(capsys):
    assert run(parse("--seqlen", "4096", "--head-dim", "128", "--heads", "16", "--batch", "4")) == 0
    out = capsys.readouterr().out
    for text in ("fwd standard", "fwd flashattn", "bwd standard", "bwd flashattn", "HBM bytes", "roofline time",
                 "bound", "Theta(N^2 d^2 / M)", "L2", "H200"):
        assert text in out
    # forward flashattn bytes: 64 heads x (2 * 1 MiB q/o + 2 * 32 query blocks * 1 MiB k/v + 16 KiB lse) = 4.43 GB
    assert "4.43 GB" in out


def test_run_json_shape_and_small_case(capsys):
    argv = ["--seqlen", "256", "--head-dim", "64", "--heads", "1", "--block-m", "128", "--block-n", "64", "--json"]
    assert run(parse(*argv)) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"problem", "tiling", "gpu", "standard", "flashattn", "asymptotic"}
    for implementation in ("standard", "flashattn"):
        for direction in ("forward", "backward"):
            section = data[implementation][direction]
            assert set(section) >= {"bytes", "bytes_once", "transfers", "flops_convention", "flops_executed",
                                    "intensity", "compute_seconds", "memory_seconds", "roofline_seconds", "bound"}
            assert section["bytes"] == sum(t["nbytes"] for t in section["transfers"])
    assert data["flashattn"]["forward"]["bytes"] == 197632
    assert data["flashattn"]["backward"]["bytes"] == 699392
    assert data["standard"]["forward"]["bytes"] == 655360
    assert data["standard"]["backward"]["bytes"] == 1179648
    assert data["tiling"]["dkdv"] == {"block_m": 128, "block_n": 64, "passes": 1}
    assert data["gpu"]["bandwidth"] == 4.23e12


def test_run_gpu_overrides(capsys):
    argv = ["--seqlen", "256", "--head-dim", "64", "--gpu", "h100", "--bandwidth-tbs", "1000", "--json"]
    assert run(parse(*argv)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"]["peak_flops"] == 789e12 and data["gpu"]["bandwidth"] == 1000e12
    assert data["flashattn"]["forward"]["bound"] == "compute"


def test_run_seqlen_q_and_k(capsys):
    assert run(parse("--seqlen-q", "1", "--seqlen-k", "4096", "--heads", "32", "--kv-heads", "8", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["problem"]["seqlen_q"], data["problem"]["seqlen_k"], data["problem"]["kv_heads"]) == (1, 4096, 8)


@pytest.mark.parametrize("argv,flag", [
    (["--seqlen", "256", "--heads", "16", "--kv-heads", "3"], "--kv-heads"),
    (["--seqlen", "256", "--block-m", "48"], "--block-m"),
    (["--seqlen", "256", "--block-n", "8"], "--block-n"),
    (["--seqlen", "256", "--head-dim", "512"], "--head-dim"),
    (["--head-dim", "64"], "--seqlen"),
    (["--seqlen-q", "64"], "--seqlen"),
])
def test_run_rejects_bad_values_naming_the_flag(capsys, argv, flag):
    assert run(parse(*argv)) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err


def test_head_dim_past_the_table_runs_with_explicit_tiles(capsys):
    assert run(parse("--seqlen", "256", "--head-dim", "512", "--block-m", "64", "--block-n", "32")) == 0


@pytest.mark.parametrize("argv", [
    ["--seqlen", "0"],
    ["--seqlen", "256", "--heads", "x"],
    ["--seqlen", "256", "--gpu", "a100"],
    ["--seqlen", "256", "--dtype", "int8"],
    ["--seqlen", "256", "--peak-tflops", "-5"],
    ["--seqlen", "256", "--sram-kb", "0"],
])
def test_argparse_rejects_bad_types_with_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    assert "argument --" in capsys.readouterr().err
