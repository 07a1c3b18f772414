"""The warp-specialized Hopper dK/dV kernel (kernels/backward_hopper.py): which backward calls take it, and their
gradients against the float64 reference under the flash-attn rule (3x PyTorch's error in the same precision).

The GPU tests force its config with ``configs.use_config`` and count the launches, so they test it at every head
dim it covers, not only where the table picks it. Gluon has no interpreter; tests/test_sm90_compile.py compiles
the table's entries for sm90 on the CPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cases import deterministic_algorithms, make_case
from hopper_kernels import forced_launch, gpu_cases, hopper

from flashattn import configs, flash_attn_func
from flashattn.launch import backward as launch_backward
from flashattn.launch.forward import l2_section_units
from flashattn.options import AttentionOptions
from flashattn.testing import check_against_reference

WS_DKDV = configs.TileConfig(64, 64, 8, 2, hopper=True)


def forced_ws_dkdv(tile: configs.TileConfig | None, monkeypatch, expect_launch: bool = True):
    return forced_launch(monkeypatch, "dkdv", launch_backward, "_hopper_dkdv", tile, expect_launch)


def test_backward_fits_only_on_the_gpu():
    q = torch.randn(1, 4, 2, 256, dtype=torch.bfloat16)
    lse = torch.randn(1, 2, 4)
    assert not launch_backward.hopper_dq_fits(q, q, q, q, lse, AttentionOptions(0.0625), None, None)


def test_table_has_hopper_dkdv_from_2k():
    for causal in (False, True):
        entry = configs.lookup("hopper", "dkdv", 256, causal, torch.bfloat16, seqlen=4096, hopper=True)
        assert entry.hopper and entry.block_m == 64 and not entry.key_slices
        for head_dim in (64, 128):  # the key-slice kernel from 2k without a mask, the Triton tiles otherwise
            entry = configs.lookup("hopper", "dkdv", head_dim, causal, torch.bfloat16, seqlen=2048,
                                   hopper=True)
            assert entry.hopper == (not causal) and entry.key_slices == (not causal)
            assert not configs.lookup("hopper", "dkdv", head_dim, causal, torch.bfloat16, seqlen=1024,
                                      hopper=True).hopper
        assert not configs.lookup("hopper", "dkdv", 256, causal, torch.bfloat16, seqlen=4096).hopper


GPU_SHAPES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim)
    (2, 1024, 1024, 4, 4, 256),
    (1, 113, 203, 4, 2, 256),
    (1, 1, 700, 4, 4, 256),
    (1, 700, 300, 2, 2, 256),
    (2, 1023, 1023, 4, 1, 128),
    (3, 257, 257, 2, 2, 64),
    (1, 2048, 2048, 8, 2, 128),
]


@gpu_cases(GPU_SHAPES)
def test_ws_dkdv_matches_reference(shape, option, monkeypatch):
    with forced_ws_dkdv(WS_DKDV, monkeypatch):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


# 128 keys a program, the tiles swept at hdim 64 and 128: two wgmma row blocks per warpgroup (one gradient each),
# or 64 keys per warpgroup with both gradients (key_slices)
WIDE_KEY_TILES = [configs.TileConfig(32, 128, 8, 3, hopper=True),
                  configs.TileConfig(64, 128, 8, 2, hopper=True),
                  configs.TileConfig(32, 128, 8, 3, hopper=True, key_slices=True),
                  configs.TileConfig(64, 128, 8, 2, hopper=True, key_slices=True),
                  configs.TileConfig(64, 128, 8, 4, hopper=True, key_slices=True)]
WIDE_KEY_SHAPES = [(2, 1023, 1023, 4, 1, 128), (1, 113, 203, 4, 2, 128), (1, 1, 300, 2, 2, 64),
                   (1, 700, 300, 2, 2, 64), (2, 257, 1000, 2, 2, 128), (2, 1023, 777, 4, 2, 64)]


@gpu_cases(WIDE_KEY_SHAPES)
@pytest.mark.parametrize("tile", WIDE_KEY_TILES,
                         ids=lambda t: f"{t.block_m}x{t.block_n}x{t.num_stages}{'-slices' if t.key_slices else ''}")
def test_ws_dkdv_128_keys_matches_reference(tile, shape, option, monkeypatch):
    with forced_ws_dkdv(tile, monkeypatch):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["plain", "causal"])
@pytest.mark.parametrize(("head_dim", "stages"), [(256, 2), (128, 3)])  # 3 stages do not fit at hdim 256
def test_ws_dkdv_fp16_scale_and_stages(head_dim, stages, option, monkeypatch):
    case = make_case((2, 333, 517, 4, 2, head_dim), option, "cuda")
    case.options["softmax_scale"] = 0.05
    with forced_ws_dkdv(configs.TileConfig(64, 64, 8, stages, hopper=True), monkeypatch):
        check_against_reference(case, torch.float16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["window", "softcap", "alibi", "dropout"])
def test_other_options_take_the_triton_dkdv(option, monkeypatch):
    with forced_ws_dkdv(WS_DKDV, monkeypatch, expect_launch=False):
        check_against_reference(make_case((1, 300, 300, 2, 2, 256), option, "cuda"), torch.bfloat16, "cuda",
                                flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("head_dim", "dtype", "expect_launch"), [
    (256, torch.bfloat16, True), (128, torch.bfloat16, True), (64, torch.float16, True), (256, torch.float32, False)])
def test_table_takes_the_hopper_dkdv_where_it_fits(head_dim, dtype, expect_launch, monkeypatch):
    case = make_case((1, 2048, 2048, 2, 2, head_dim), "causal" if head_dim == 256 else "plain", "cuda")
    with forced_ws_dkdv(None, monkeypatch, expect_launch=expect_launch):
        check_against_reference(case, dtype, "cuda", flash_attn_func)


# dQ fused into the key-slice dK/dV kernel (kernels/backward_fused_dq.py) at hdim 64 and 128: float32 dQ^T tiles
# added by TMA reductions, then a pass that transposes, scales and rounds; the table's choice (phase "dkdv_dq") for
# non-deterministic calls from 1k tokens (causal hdim 128: 2k), forced here at every length. At hdim 64 the consumers
# take dQ^T in turns, block by block: odd block counts (1, 113 -> 2 blocks, 257 -> 5, 700 -> 11) and GQA groups. The
# one-tile kernel takes 64-row query blocks; 128-row ones, the persistent form's (the table's from 1k), below
FUSED_DQ = configs.TileConfig(64, 128, 8, 2, hopper=True, key_slices=True)
FUSED_DQ_SHAPES = [(2, 1023, 1023, 4, 1, 128), (1, 113, 203, 4, 2, 128), (1, 113, 113, 2, 2, 128),
                   (1, 4096, 4096, 2, 2, 128), (1, 4096, 4096, 4, 1, 128), (2, 257, 1000, 2, 2, 128),
                   (2, 1023, 777, 4, 2, 128), (1, 700, 300, 2, 2, 128), (1, 1, 300, 2, 2, 128),
                   (2, 1023, 1023, 4, 1, 64), (1, 113, 203, 4, 2, 64), (1, 113, 113, 2, 2, 64),
                   (1, 4096, 4096, 2, 2, 64), (1, 4096, 4096, 8, 2, 64), (2, 257, 1000, 2, 2, 64),
                   (3, 1023, 777, 4, 2, 64), (1, 700, 300, 2, 2, 64), (1, 1, 300, 2, 2, 64)]


def fused_dq_passes(monkeypatch, expect_fused: bool, tile: configs.TileConfig | None = FUSED_DQ):
    """Under ``tile`` for the fused phase, whether the fused kernel's scaling pass ran."""
    return forced_launch(monkeypatch, "dkdv_dq", launch_backward, "_dq_from_accumulator", tile, expect_fused)


@gpu_cases(FUSED_DQ_SHAPES)
def test_fused_dq_matches_reference(shape, option, monkeypatch):
    with fused_dq_passes(monkeypatch, True, FUSED_DQ):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


# its persistent form (kernels/backward_fused_dq_persistent.py): tiles from a counter in L2 sections, a program's rings
# run on from tile to tile. Fewer tiles than SMs and more (224 and 352 on an H200's 132), odd block counts (777 -> 13
# 64-row blocks, 7 of 128 rows: at hdim 64 a program's next tile then starts on consumer 1's turn), GQA, seqlen_q !=
# seqlen_k, sections of 2 and 1 (kv) heads (4096 queries at hdim 128, group 2: 4 MB of Q and dO a head), one query
# row, a 128-row block whose second half lies past seqlen_q (113, 1); hdim 64 on 128-row blocks (the table's from 1k)
PERSISTENT_FUSED_DQ = {128: dataclasses.replace(FUSED_DQ, persistent=True),
                       64: dataclasses.replace(FUSED_DQ, block_m=128, persistent=True)}
PERSISTENT_FUSED_DQ_SHAPES = [(2, 1023, 777, 4, 2, 128), (1, 113, 203, 4, 2, 64), (8, 777, 777, 4, 4, 64),
                              (4, 1500, 1300, 16, 8, 128), (1, 4096, 3000, 6, 3, 128), (1, 1, 300, 2, 2, 64)]


@gpu_cases(PERSISTENT_FUSED_DQ_SHAPES)
def test_persistent_fused_dq_matches_reference(shape, option, monkeypatch):
    kernel, _ = launch_backward.hopper_dkdv_kernel(PERSISTENT_FUSED_DQ[shape[-1]], fused=True)
    assert kernel.fn.__name__ == "dkdv_dq_persistent_kernel"
    with fused_dq_passes(monkeypatch, True, PERSISTENT_FUSED_DQ[shape[-1]]):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


# and at hdim 64 on 64-row query blocks, the table's tile at <= 512 tokens (777 -> 13 blocks)
@gpu_cases([(1, 113, 203, 4, 2, 64), (8, 777, 777, 4, 4, 64), (1, 1, 300, 2, 2, 64)])
def test_persistent_fused_dq_on_64_row_blocks_matches_reference(shape, option, monkeypatch):
    with fused_dq_passes(monkeypatch, True, dataclasses.replace(PERSISTENT_FUSED_DQ[64], block_m=64)):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


# Under a causal mask the one-tile dK/dV grids take their key tiles in L2 sections of (batch, kv head) pairs
# (backward_hopper.sectioned_key_tile): with the budget shrunk to three pairs' Q and dO, 8 pairs run in sections of 3,
# 3 and 2, and every key tile is computed once, the short last section's too
@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kernel", ["two-pass", "key-slices", "fused"])
def test_one_tile_grids_walk_causal_key_tiles_in_sections(kernel, monkeypatch):
    shape = (2, 1023, 1023, 8, 4, 128)  # GQA: each pair's group of two query heads reads its Q and dO
    group_bytes = 2 * 2 * 1023 * 128 * 2
    monkeypatch.setattr(configs, "HOPPER_L2_SECTION_BYTES", 3 * group_bytes)
    assert l2_section_units(8, group_bytes, configs.HOPPER_L2_SECTION_BYTES) == 3
    case = make_case(shape, "causal", "cuda")
    if kernel == "fused":
        with fused_dq_passes(monkeypatch, True, FUSED_DQ):
            check_against_reference(case, torch.bfloat16, "cuda", flash_attn_func)
        return
    with forced_ws_dkdv(WS_DKDV if kernel == "two-pass" else WIDE_KEY_TILES[3], monkeypatch):
        check_against_reference(case, torch.bfloat16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("head_dim", "stages"), [(128, 2), (64, 3), (64, 2)])
def test_fused_dq_fp16_and_scale(head_dim, stages, monkeypatch):
    case = make_case((2, 333, 517, 4, 2, head_dim), "causal", "cuda")
    case.options["softmax_scale"] = 0.05
    with fused_dq_passes(monkeypatch, True, dataclasses.replace(FUSED_DQ, num_stages=stages)):
        check_against_reference(case, torch.float16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("switch", ["argument", "torch"])
def test_deterministic_backward_keeps_two_passes_and_repeats(head_dim, causal, switch, monkeypatch):
    """deterministic=True, or torch.use_deterministic_algorithms(True): the two passes, bitwise repeatable over 10
    runs, even with the fused tile forced."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1023, 4, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    dout = torch.randn_like(q)

    def gradients():
        inputs = [x.detach().requires_grad_() for x in (q, k, v)]
        out = flash_attn_func(*inputs, causal=causal, deterministic=switch == "argument")
        return torch.autograd.grad(out, inputs, dout)

    with fused_dq_passes(monkeypatch, False), deterministic_algorithms(switch == "torch"):
        runs = [gradients() for _ in range(10)]
    for run in runs[1:]:
        for a, b in zip(runs[0], run, strict=True):
            assert torch.equal(a, b)


@pytest.mark.gpu
@hopper
def test_fused_dq_tile_stays_two_passes_at_hdim_256_or_under_a_forced_dkdv_tile(monkeypatch):
    """The fused kernel computes dQ^T in row blocks of 64 head dims, at hdim 64 and 128: at hdim 256 a forced fused
    tile runs the two passes; so does a forced dK/dV tile (what the sweeps time) at hdim 128, where the table would
    fuse."""
    with fused_dq_passes(monkeypatch, False):
        check_against_reference(make_case((1, 700, 300, 2, 2, 256), "plain", "cuda"), torch.bfloat16, "cuda",
                                flash_attn_func)
    two_pass = configs.lookup("hopper", "dkdv", 128, False, torch.bfloat16, seqlen=4096, hopper=True)
    with forced_ws_dkdv(two_pass, monkeypatch), fused_dq_passes(monkeypatch, False, tile=None):
        check_against_reference(make_case((1, 4096, 4096, 2, 2, 128), "plain", "cuda"), torch.bfloat16, "cuda",
                                flash_attn_func)


def test_table_fuses_dq_at_hdim_64_and_128():
    def fused(head_dim, causal, seqlen):
        return configs.lookup("hopper", "dkdv_dq", head_dim, causal, torch.bfloat16, seqlen=seqlen, hopper=True)

    assert fused(128, False, 512) == fused(128, True, 512) == fused(128, True, 16384) == FUSED_DQ
    # hdim 64: the persistent form from 512, on 64-row query blocks there and 128-row ones from 1k
    assert fused(64, False, 1024) == fused(64, True, 1024) == fused(64, False, 16384) == PERSISTENT_FUSED_DQ[64]
    assert fused(64, False, 512) == fused(64, True, 512) == dataclasses.replace(PERSISTENT_FUSED_DQ[64], block_m=64)
    for head_dim in (64, 128):
        assert fused(head_dim, False, 256) is None and fused(head_dim, True, 256) is None
    assert fused(256, False, 4096) is None and fused(256, True, 4096) is None
    q = torch.empty(1, 4096, 2, 128, dtype=torch.bfloat16)
    assert launch_backward.fused_dq_config(q, False, AttentionOptions(0.1), 4096) is None
    with configs.use_config("dkdv_dq", FUSED_DQ):
        assert launch_backward.fused_dq_config(q, True, AttentionOptions(0.1), 4096) == FUSED_DQ
        assert launch_backward.fused_dq_config(q, True, AttentionOptions(0.1, deterministic=True), 4096) is None
        with configs.use_config("dkdv", configs.TileConfig(32, 128, 8, 3, hopper=True, key_slices=True)):
            assert launch_backward.fused_dq_config(q, True, AttentionOptions(0.1), 4096) == FUSED_DQ
        # the kernel covers hdim 64 too (the consumers' turns), not 256
        assert launch_backward.fused_dq_config(q[..., :64], True, AttentionOptions(0.1), 4096) == FUSED_DQ
        q_256 = torch.empty(1, 4096, 2, 256, dtype=torch.bfloat16)
        assert launch_backward.fused_dq_config(q_256, True, AttentionOptions(0.1), 4096) is None
    # the two passes' tiles are the key slices' 32 rows at hdim 128, 64 at hdim 64
    for head_dim, rows in ((128, 32), (64, 64)):
        entry = configs.lookup("hopper", "dkdv", head_dim, False, torch.bfloat16, seqlen=4096, hopper=True)
        assert entry.key_slices and entry.block_m == rows


def in_place(acc: torch.Tensor, batch: int, nheads: int, seqlen_q: int, head_dim: int) -> torch.Tensor:
    """The fused kernel's dQ^T accumulator back in (batch, seqlen_q, nheads, head_dim) order: each 16 x 256 tile is
    a [64 head dims, 64 queries] block in the kernel's register order (backward_fused_dq._register_order: the wgmma
    layout's (warp, r1, lane // 4) rows and (i, lane % 4, r0) columns, stored as (i, warp | lane // 4, lane % 4, r1,
    r0)), undone here by the inverse permutation; the blocks a head in whole pairs."""
    blocks = 2 * -(-seqlen_q // 128)
    tiles = acc.reshape(batch, nheads, blocks, head_dim // 64, 8, 2, 2, 8, 4, 2, 2)
    # (i, w // 2, w % 2, lane // 4, lane % 4, r1, r0) -> (w // 2, w % 2, r1, lane // 4 | i, lane % 4, r0)
    tiles = tiles.permute(0, 1, 2, 3, 5, 6, 9, 7, 4, 8, 10).reshape(batch, nheads, blocks, head_dim // 64, 64, 64)
    dq_t = tiles.permute(0, 1, 3, 4, 2, 5).reshape(batch, nheads, head_dim, blocks * 64)  # dQ^T of each head
    return dq_t[..., :seqlen_q].permute(0, 3, 1, 2)


def test_dq_accumulator_and_its_conversion(triton_backend):
    """The fused kernel's dQ^T accumulator: a 16 x 256 tile for each (batch, head, 64-query block, 64 head dims),
    the blocks a head in whole pairs (a 128-row block's halves), in rows of 256 (its descriptor's block one tile, not
    swizzled), and the pass back to dq (put in place, scaled, rounded) on the GPU or under the interpreter, in
    float16 (the interpreter's bfloat16 rounding is not round-to-nearest-even): one query at hdim 64 (two blocks, the
    second past seqlen_q), and 130 (three 64-row blocks, the last partial, and a fourth past it) at hdim 128."""
    for seqlen_q, head_dim in ((1, 64), (130, 128)):
        q = torch.empty(2, seqlen_q, 3, head_dim, dtype=torch.float16, device=triton_backend)
        acc = launch_backward.dq_accumulator(q)
        tiles = 2 * 3 * 2 * -(-seqlen_q // 128) * (head_dim // 64)
        assert acc.shape == (tiles * 16, 256) and not acc.any()
        desc = launch_backward.dq_accumulator_descriptor(acc)
        assert list(desc.shape) == [tiles * 16, 256] and list(desc.strides) == [256, 1]
        assert list(desc.block_shape) == [16, 256]
        acc.normal_()
        dq = torch.empty_like(q)
        launch_backward._dq_from_accumulator(acc, dq, AttentionOptions(0.125))
        assert torch.equal(dq, (in_place(acc, 2, 3, seqlen_q, head_dim) * 0.125).half())
