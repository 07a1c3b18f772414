"""The warp-specialized Hopper dQ kernel (kernels/dq_hopper.py): which backward calls take it, and their gradients
against the float64 reference under the flash-attn rule (3x PyTorch's error in the same precision).

The GPU tests force its config with ``configs.use_config`` and count the launches, so they test every head dim and
tile it covers, not only the table's. Gluon has no interpreter; tests/test_sm90_compile.py compiles the tiles for
sm90 on the CPU.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from cases import make_case, make_varlen_case
from hopper_kernels import forced_launch, gpu_cases, hopper

from flashattn import configs, flash_attn_func, validation
from flashattn.launch import backward as launch_backward
from flashattn.launch import common
from flashattn.launch import forward as launch_forward
from flashattn.testing import check_against_reference, check_varlen_against_reference

# (keys a block, stages): 3 stages fetch K a block ahead; hdim 256 fits 3 stages of 32 keys (224 KB); c3: three
# consumer warpgroups (192 query rows a program)
WS_DQ_TILES = {"n64-s3": configs.TileConfig(128, 64, 8, 3, hopper=True),
               "n64-s2": configs.TileConfig(128, 64, 8, 2, hopper=True),
               "n32-s3": configs.TileConfig(128, 32, 8, 3, hopper=True),
               "n64-s3-c3": configs.TileConfig(128, 64, 8, 3, hopper=True, three_consumers=True)}


@contextlib.contextmanager
def forced_ws_dq(tile: configs.TileConfig | None, monkeypatch, expect_launch: bool = True):
    """The dQ kernel's launches under ``tile``, in the two passes (where the table would fuse dQ into dK/dV)."""
    with configs.use_config("dkdv_dq", None), forced_launch(monkeypatch, "dq", launch_backward, "_hopper_dq", tile,
                                                            expect_launch):
        yield


def test_tile_plan_arguments_dense_and_varlen():
    q, k = torch.empty(2, 300, 8, 128), torch.empty(2, 300, 2, 128)
    dense = common.Layout.of(q, k, None)
    tiles, plan = launch_forward.tile_plan_arguments(q, k, torch.empty(2, 8, 300), dense, 128, False)
    # lse strides, lengths, nheads, group size, row tiles, (sequence, head) pairs, pairs per L2 section (all fit)
    assert (tiles, plan) == (3 * 16, (2400, 300, 300, 300, 8, 4, 3, 16, 16))
    packing = validation.Packing(torch.tensor([0, 100, 300]), torch.tensor([0, 50, 300]), 200, 250)
    packed = common.Layout.of(q[0], k[0], packing)
    tiles, plan = launch_forward.tile_plan_arguments(q[0], k[0], torch.empty(8, 300), packed, 128, False)
    assert (tiles, plan[:4]) == (2 * 16, (0, 300, 300, 300))  # (nheads, total_q): no batch stride


GPU_SHAPES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim)
    (2, 1024, 1024, 4, 4, 128),
    (1, 113, 203, 4, 2, 128),
    (1, 1, 700, 4, 4, 64),
    (1, 700, 300, 2, 2, 64),
    (2, 1023, 1023, 4, 1, 128),
    (3, 257, 257, 2, 2, 64),
]
SHAPES_256 = [(2, 1023, 1023, 4, 2, 256), (1, 113, 203, 4, 4, 256), (1, 700, 300, 2, 2, 256)]


@gpu_cases(GPU_SHAPES)
@pytest.mark.parametrize("tile", ["n64-s3", "n64-s2", "n32-s3", "n64-s3-c3"])
def test_ws_dq_matches_reference(tile, shape, option, monkeypatch):
    with forced_ws_dq(WS_DQ_TILES[tile], monkeypatch):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


@gpu_cases(SHAPES_256)
def test_ws_dq_256_matches_reference(shape, option, monkeypatch):
    with forced_ws_dq(WS_DQ_TILES["n32-s3"], monkeypatch):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["plain", "causal"])
def test_ws_dq_fp16_scale(option, monkeypatch):
    case = make_case((2, 333, 517, 4, 2, 128), option, "cuda")
    case.options["softmax_scale"] = 0.05
    with forced_ws_dq(WS_DQ_TILES["n64-s3"], monkeypatch):
        check_against_reference(case, torch.float16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["plain", "causal"])
@pytest.mark.parametrize("seqlens", [([1, 300, 129, 0, 64], [5, 300, 700, 3, 64]), ([1000, 17], [1000, 17])],
                         ids=["mixed", "equal"])
@pytest.mark.parametrize("tile", ["n64-s3", "n64-s3-c3"])
def test_ws_dq_varlen_matches_reference(seqlens, option, tile, monkeypatch):
    case = make_varlen_case((*seqlens, 4, 2, 128), option, "cuda")
    with forced_ws_dq(WS_DQ_TILES[tile], monkeypatch):
        check_varlen_against_reference(case, torch.bfloat16, "cuda")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["window", "softcap", "alibi", "dropout"])
def test_other_options_take_the_triton_dq(option, monkeypatch):
    with forced_ws_dq(WS_DQ_TILES["n64-s3"], monkeypatch, expect_launch=False):
        check_against_reference(make_case((1, 300, 300, 2, 2, 128), option, "cuda"), torch.bfloat16, "cuda",
                                flash_attn_func)


def test_table_has_hopper_dq_at_hdim_128_and_256():
    for causal in (False, True):
        for head_dim, keys in ((128, 64), (256, 32)):
            entry = configs.lookup("hopper", "dq", head_dim, causal, torch.bfloat16, seqlen=4096,
                                   hopper=True)
            assert entry.hopper and entry.block_n == keys and entry.num_stages == 3
            assert not configs.lookup("hopper", "dq", head_dim, causal, torch.bfloat16, seqlen=4096).hopper
        assert not configs.lookup("hopper", "dq", 64, causal, torch.bfloat16, seqlen=4096,
                                  hopper=True).hopper
        # short sequences too, causal or not
        for head_dim in (128, 256):
            for seqlen in (configs.SHORTEST_SEQLEN, configs.SHORT_SEQLEN):
                short = configs.lookup("hopper", "dq", head_dim, causal, torch.bfloat16, seqlen=seqlen,
                                       hopper=True)
                assert short.hopper, (head_dim, causal, seqlen)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("head_dim", "dtype", "expect_launch"), [
    (256, torch.bfloat16, True), (128, torch.float16, True), (64, torch.bfloat16, False),
    (128, torch.float32, False)])
def test_table_takes_the_hopper_dq_where_it_fits(head_dim, dtype, expect_launch, monkeypatch):
    case = make_case((1, 2048, 2048, 2, 2, head_dim), "causal", "cuda")
    with forced_ws_dq(None, monkeypatch, expect_launch=expect_launch):
        check_against_reference(case, dtype, "cuda", flash_attn_func)

