"""The warp-specialized Hopper forward (kernels/forward_hopper.py): which calls take it, and its results
against the float64 reference under the flash-attn rule, with gradients through its saved LSE.

The GPU tests force its config with ``configs.use_config`` and count the launches, so they test it even
where the table picks the Triton kernel. The kernel has no interpreter form (Gluon does not run under
TRITON_INTERPRET); tests/test_sm90_compile.py compiles it for sm90 on the CPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cases import make_case, make_varlen_case
from hopper_kernels import forced_launch, gpu_cases, hopper

from flashattn import configs, flash_attn_func, flash_attn_qkvpacked_func
from flashattn.launch import common
from flashattn.launch import forward as launch_forward
from flashattn.options import AttentionOptions
from flashattn.testing import check_against_reference, check_varlen_against_reference

HOPPER_TILES = {
    "n128-s2": configs.TileConfig(128, 128, 8, 2, hopper=True),
    "n128-s3": configs.TileConfig(128, 128, 8, 3, hopper=True),
    "n32-s4": configs.TileConfig(128, 32, 8, 4, hopper=True),
    "n64-s2": configs.TileConfig(128, 64, 8, 2, hopper=True),
    "n128-s2-persistent": configs.TileConfig(128, 128, 8, 2, hopper=True, persistent=True),
    "n128-s3-consumers3": configs.TileConfig(128, 128, 8, 3, hopper=True, three_consumers=True),
    "n128-s3-consumers3-persistent": configs.TileConfig(128, 128, 8, 3, hopper=True, three_consumers=True,
                                                        persistent=True),
    # one consumer warpgroup a 64-row tile, two programs an SM
    "m64-n64-s2-persistent": configs.TileConfig(64, 64, 4, 2, hopper=True, persistent=True),
    "m64-n128-s2-persistent": configs.TileConfig(64, 128, 4, 2, hopper=True, persistent=True),
}


def tile_head_dim(tile: str) -> int:
    """The head dim a tile serves in the table: 64 for three consumers and the one-consumer 128-key tile, else 128."""
    return 64 if HOPPER_TILES[tile].three_consumers or tile == "m64-n128-s2-persistent" else 128


def forced_ws(tile: configs.TileConfig | None, monkeypatch, expect_launch: bool = True):
    return forced_launch(monkeypatch, "forward", launch_forward, "_hopper_forward", tile, expect_launch)


def test_token_rows_reads_heads_side_by_side():
    x = torch.randn(2, 5, 3, 8)
    assert common.token_rows(x) == 24
    packed = torch.randn(2, 5, 3, 3, 8)[:, :, 1]  # q of a qkv-packed tensor
    assert common.token_rows(packed) == 72
    assert common.token_rows(x.transpose(1, 2)) is None  # (B, H, S, D) viewed as (B, S, H, D)
    assert common.token_rows(torch.randn(7, 3, 8)) == 24
    assert common.token_rows(torch.randn(3, 5, 3, 8)[::2]) is None  # a batch stride that skips rows
    assert common.token_rows(torch.randn(2, 1, 3, 8).expand(2, 5, 3, 8)) is None  # every token the same row


def test_rows_readable_takes_sequences_at_any_batch_stride():
    cache = torch.randn(3, 50, 4, 8)
    assert common.rows_readable(cache) and common.rows_readable(cache[:, :20])  # a cache's first keys
    assert common.token_rows(cache[:, :20]) is None  # not one (tokens, H * D) matrix
    assert common.rows_readable(torch.randn(2, 5, 3, 3, 8)[:, :, 1])  # q of a qkv-packed tensor
    assert common.rows_readable(cache[:1, :, :1])  # one sequence of one head: its other strides are free
    assert not common.rows_readable(cache.transpose(1, 2))  # (B, H, S, D) viewed as (B, S, H, D)
    assert not common.rows_readable(cache[:, :, ::2])  # heads not side by side
    assert not common.rows_readable(torch.randn(2, 1, 3, 8).expand(2, 5, 3, 8))  # every token the same row
    assert not common.rows_readable(torch.randn(1, 5, 3, 8).expand(2, 5, 3, 8))  # every sequence the same rows
    # packed: one (tokens, H * D) matrix
    assert common.rows_readable(torch.randn(7, 3, 8)) and not common.rows_readable(torch.randn(7, 3, 16)[:, :, :8])


def test_token_descriptor_spans_every_token_and_one_head_per_block():
    packed = torch.randn(2, 300, 3, 4, 64, dtype=torch.float16)[:, :, 2]  # v of a qkv-packed tensor
    descriptor = common.token_descriptor(packed, 128)
    assert descriptor.base.data_ptr() == packed.data_ptr()
    assert list(descriptor.shape) == [600, 256] and list(descriptor.strides) == [768, 1]
    assert list(descriptor.block_shape) == [128, 64]
    assert descriptor.layout.element_bitwidth == 16 and descriptor.layout.swizzle_byte_width == 128
    # the layout is built once per tile shape and dtype
    assert common.token_descriptor(packed, 128).layout is descriptor.layout


def test_hopper_forward_fits_only_gpu_plain_softmax():
    q = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16)
    opts = AttentionOptions(0.125)
    assert not launch_forward.hopper_forward_fits(q, q, q, opts, None, None, None)  # a CPU tensor


def test_persistent_grid_hands_out_tiles_by_a_counter():
    persistent = HOPPER_TILES["n128-s2-persistent"]
    for causal, is_varlen in ((True, False), (False, True), (False, False)):
        constexprs = launch_forward.hopper_forward_constexprs(persistent, 128, causal=causal, is_varlen=is_varlen)
        assert constexprs["DYNAMIC_TILES"]
    # one tile a program: nothing to hand out
    one_tile = launch_forward.hopper_forward_constexprs(HOPPER_TILES["n128-s2"], 128, causal=True, is_varlen=True)
    assert not one_tile["DYNAMIC_TILES"]


def test_persistent_grid_holds_a_second_q_tile_where_shared_memory_has_room():
    def constexprs(tile, head_dim):
        return launch_forward.hopper_forward_constexprs(tile, head_dim, causal=True, is_varlen=False)

    # hdim 128, two stages of 128 keys: two Q tiles (64 KB), the ring (128 KB) and the 16-byte store's staging (32 KB)
    assert constexprs(HOPPER_TILES["n128-s2-persistent"], 128)["Q_BUFFERS"] == 2
    assert not constexprs(HOPPER_TILES["n128-s2-persistent"], 128)["STORE_THROUGH_Q"]
    assert constexprs(HOPPER_TILES["n128-s3-consumers3-persistent"], 64)["Q_BUFFERS"] == 2
    assert constexprs(HOPPER_TILES["n128-s2"], 128)["Q_BUFFERS"] == 1  # one tile a program: nothing to copy ahead
    packed = launch_forward.hopper_forward_constexprs(HOPPER_TILES["n128-s2-persistent"], 128, causal=False,
                                                      is_varlen=True)
    assert packed["Q_BUFFERS"] == 2  # packed calls too (launch_forward._forward_q_buffers)
    hdim_256 = configs.TileConfig(128, 64, 8, 2, hopper=True, persistent=True)
    assert constexprs(hdim_256, 256)["Q_BUFFERS"] == 1  # 64 KB of Q beside a 128 KB ring
    assert constexprs(hdim_256, 256)["STORE_THROUGH_Q"]  # and no room for the store's staging: O goes through Q


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tile", ["n128-s2-persistent", "n128-s3-consumers3-persistent",
                                  "m64-n64-s2-persistent", "m64-n128-s2-persistent"])
def test_persistent_forward_repeats_and_leaves_no_tile_out(tile, causal, monkeypatch):
    # the tiles come from a counter, a fresh one each call. Which program computes a tile does not change its
    # arithmetic, so back-to-back calls and another grid give the same bits; a tile taken twice would give them too,
    # but a tile left out would leave its rows unwritten. 16 heads: 3-6 tiles a program, so that each of the two Q
    # buffers is refilled more than once
    persistent = HOPPER_TILES[tile]
    head_dim = tile_head_dim(tile)
    q, k, v = (torch.randn(3, 1500, 16, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with forced_ws(persistent, monkeypatch):
        first = flash_attn_func(q, k, v, causal=causal)
        second = flash_attn_func(q, k, v, causal=causal)
    # one program a tile: programs start as others end, the grid on which a barrier left initialized and unused cost
    # 8 bytes of O in 1.8% of the one-consumer tiles (forward_hopper.zeroing_barrier)
    with forced_ws(dataclasses.replace(persistent, persistent=False), monkeypatch):
        other = flash_attn_func(q, k, v, causal=causal)
    assert torch.equal(first, second)
    assert torch.equal(first, other)


def test_one_consumer_forward_runs_two_programs_an_sm():
    one_consumer = HOPPER_TILES["m64-n64-s2-persistent"]
    assert launch_forward.programs_per_sm(one_consumer) == 2
    assert launch_forward.programs_per_sm(dataclasses.replace(one_consumer, persistent=False)) == 2
    assert launch_forward.programs_per_sm(HOPPER_TILES["n128-s2"]) == 1
    assert launch_forward.programs_per_sm(HOPPER_TILES["n128-s3-consumers3-persistent"]) == 1


def test_dq_and_fp8_forward_refuse_a_one_consumer_tile():
    # they share the forward's tiles of two or three consumers; a 64-row tile is the 16-bit forward's alone
    assert launch_forward.shared_consumer_warpgroups(HOPPER_TILES["n128-s2"], "dQ") == 2
    assert launch_forward.shared_consumer_warpgroups(HOPPER_TILES["n128-s3-consumers3"], "dQ") == 3
    with pytest.raises(ValueError, match="config: the Hopper FP8 forward takes 128-row tiles"):
        launch_forward.shared_consumer_warpgroups(HOPPER_TILES["m64-n64-s2-persistent"], "FP8 forward")


def test_heads_per_section_fits_the_l2_budget(monkeypatch):
    monkeypatch.setattr(configs, "HOPPER_L2_SECTION_BYTES", 8 << 20)
    # 4k keys at hdim 128 in bf16: K and V of one head take 2 MiB, so 4 heads a section
    assert launch_forward._heads_per_section(64, 1, 4096 * 128 * 2, False) == 4
    assert launch_forward._heads_per_section(64, 4, 4096 * 128 * 2, False) == 16  # four query heads share one K/V head
    assert launch_forward._heads_per_section(3, 1, 512 * 128 * 2, False) == 3  # never more than the launch has
    assert launch_forward._heads_per_section(64, 1, 1 << 30, False) == 1  # one head past the budget still runs
    # 100 heads, at most 4 a section: 25 sections of 4; at most 32 (4x the budget, pairs of query heads on one K/V
    # head): 4 sections of 25, not 32, 32, 32 and 4
    assert launch_forward._heads_per_section(100, 1, 4096 * 128 * 2, False) == 4
    monkeypatch.setattr(configs, "HOPPER_L2_SECTION_BYTES", 32 << 20)
    assert launch_forward._heads_per_section(100, 2, 4096 * 128 * 2, False) == 25
    # causal tiles take their own budget
    monkeypatch.setattr(configs, "HOPPER_CAUSAL_L2_SECTION_BYTES", 16 << 20)
    assert launch_forward._heads_per_section(64, 1, 4096 * 128 * 2, causal=True) == 8


GPU_SHAPES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim)
    (2, 1024, 1024, 4, 4, 128),
    (1, 113, 203, 4, 2, 128),
    (2, 1023, 1023, 4, 1, 64),
    (1, 1, 700, 4, 4, 256),
    (1, 700, 300, 2, 2, 128),
    (3, 257, 257, 2, 2, 256),
    (1, 4096, 4096, 2, 2, 64),
    (4, 2048, 2048, 8, 2, 128),  # 512 tiles: several a program on a persistent grid
    # causal with unequal lengths: a tile's consumers see different key blocks, and some rows see none
    (1, 333, 901, 2, 2, 64),
    (1, 901, 333, 2, 1, 64),
]


@gpu_cases(GPU_SHAPES)
@pytest.mark.parametrize("tile", list(HOPPER_TILES), ids=list(HOPPER_TILES))
def test_ws_forward_matches_reference(shape, option, tile, monkeypatch):
    if HOPPER_TILES[tile].block_n == 128 and shape[-1] == 256:
        pytest.skip("hdim 256 with 128-key blocks does not fit in registers")
    if HOPPER_TILES[tile].three_consumers and shape[-1] != 64:
        pytest.skip("three consumers are for hdim 64 (160 registers a thread)")
    if HOPPER_TILES[tile].block_m == 64 and shape[-1] == 256:
        pytest.skip("one consumer at hdim 256 does not fit in two programs' registers")
    with forced_ws(HOPPER_TILES[tile], monkeypatch):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func,
                                backward=shape[1] <= 1024)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("tile", ["n128-s2-persistent", "n128-s3-consumers3-persistent",
                                  "m64-n64-s2-persistent", "m64-n128-s2-persistent"])
@pytest.mark.parametrize("option", ["plain", "causal"])
# tiles that may see no whole key block, on grids of 4-8 tiles a program, two Q tiles: the first two shapes are the
# ones that ptxas once compiled wrong when not causal (it reused Q descriptors across the kernel's two key-block runs,
# forward_hopper._tile_key_blocks); the second is a cross-attention of 77 keys, the third has causal rows that see
# no key
@pytest.mark.parametrize("shape", [(64, 89, 89, 16, 16), (4, 1024, 77, 16, 4), (4, 1024, 200, 16, 4)],
                         ids=["89x89", "1024x77", "1024x200"])
def test_ws_forward_tiles_that_may_see_no_whole_block(shape, option, tile, monkeypatch):
    head_dim = tile_head_dim(tile)
    with forced_ws(HOPPER_TILES[tile], monkeypatch):
        check_against_reference(make_case((*shape, head_dim), option, "cuda"), torch.bfloat16, "cuda",
                                flash_attn_func, backward=False)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("tile", ["n128-s2", "n128-s2-persistent"])
@pytest.mark.parametrize("option", ["plain", "causal"])
def test_ws_forward_walks_heads_in_sections(option, tile, monkeypatch):
    # 8 (sequence, head) pairs in sections of 3, 3 and 2: every tile computed once, the short last section too
    shape = (2, 1023, 1023, 4, 2, 128)
    for budget in ("HOPPER_L2_SECTION_BYTES", "HOPPER_CAUSAL_L2_SECTION_BYTES"):
        monkeypatch.setattr(configs, budget, 3 * 1023 * 128 * 2)
    assert launch_forward._heads_per_section(8, 2, 1023 * 128 * 2, causal=option == "causal") == 3
    with forced_ws(HOPPER_TILES[tile], monkeypatch):
        check_against_reference(make_case(shape, option, "cuda"), torch.bfloat16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["plain", "causal"])
def test_ws_forward_fp16_and_scale(option, monkeypatch):
    case = make_case((2, 333, 517, 4, 2, 128), option, "cuda")
    case.options["softmax_scale"] = 0.05
    with forced_ws(HOPPER_TILES["n128-s2"], monkeypatch):
        check_against_reference(case, torch.float16, "cuda", flash_attn_func)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("causal", [False, True])
def test_ws_forward_qkvpacked_view(causal, monkeypatch):
    qkv = torch.randn(2, 600, 3, 4, 128, device="cuda", dtype=torch.bfloat16)
    with forced_ws(HOPPER_TILES["n128-s2"], monkeypatch):
        out = flash_attn_qkvpacked_func(qkv, causal=causal)
    with configs.use_config("forward", configs.TileConfig(128, 64, 8, 3)):
        expected = flash_attn_qkvpacked_func(qkv, causal=causal)
    # the same softmax in another order of sums: equal to bf16 rounding
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["plain", "causal", "softcap"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(2, 300, 333), (2, 1100, 1029)])
def test_slices_of_longer_sequences_are_read_in_place(batch, seqlen_q, seqlen_k, head_dim, option, monkeypatch):
    """q, k and v the first tokens of longer buffers (a batch stride that skips rows, as a cache's first keys): the
    Hopper forward and backward (plain, causal; from 1k the Hopper dK/dV kernels) and the Triton tile (softcap) read
    them in place through (batch, seqlen, heads x head dim) descriptors, within the flash-attn rule."""
    case = make_case((batch, seqlen_q, seqlen_k, 4, 2, head_dim), option, "cuda")
    lengths = (seqlen_q, seqlen_k, seqlen_k)
    inputs = [torch.randn(batch, length + 77, heads, head_dim, device="cuda", dtype=torch.bfloat16)[:, :length]
              for length, heads in zip(lengths, (4, 2, 2), strict=True)]
    assert all(common.token_rows(x) is None and common.rows_readable(x) for x in inputs)
    descriptors = []
    qkv_descriptors = launch_forward._qkv_descriptors

    def counting(*args):
        found = qkv_descriptors(*args)
        descriptors.append(found["SEQUENCES"])
        return found

    monkeypatch.setattr(launch_forward, "_qkv_descriptors", counting)
    tile = None if option == "softcap" else HOPPER_TILES["n128-s2" if head_dim == 128 else "n128-s3-consumers3"]
    with forced_ws(tile, monkeypatch, expect_launch=option != "softcap"):
        check_against_reference(case, torch.bfloat16, "cuda", flash_attn_func, inputs=inputs)
    assert descriptors == ([] if option != "softcap" else [True])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["plain", "causal"])
# "short": 3-4 tiles a program on a persistent grid, most with a consumer (or all) past their sequence's end
@pytest.mark.parametrize("seqlens", [([1, 300, 129, 0, 64], [5, 300, 700, 3, 64]), ([1000, 17], [1000, 17]),
                                     ([17] * 40 + [300], [23] * 40 + [250])], ids=["mixed", "equal", "short"])
@pytest.mark.parametrize(("tile", "head_dim"), [("n128-s2", 128), ("n128-s3-consumers3", 64),
                                               ("n128-s2-persistent", 128), ("n128-s3-consumers3-persistent", 64),
                                               ("m64-n64-s2-persistent", 128), ("m64-n128-s2-persistent", 64)])
def test_ws_varlen_matches_reference(seqlens, option, tile, head_dim, monkeypatch):
    case = make_varlen_case((*seqlens, 4, 2, head_dim), option, "cuda")
    with forced_ws(HOPPER_TILES[tile], monkeypatch):
        check_varlen_against_reference(case, torch.bfloat16, "cuda")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("option", ["window", "softcap", "alibi", "dropout"])
def test_other_options_take_the_triton_kernel(option, monkeypatch):
    with forced_ws(HOPPER_TILES["n128-s2"], monkeypatch, expect_launch=False):
        check_against_reference(make_case((1, 300, 300, 2, 2, 128), option, "cuda"), torch.bfloat16, "cuda",
                                flash_attn_func, backward=False)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("head_dim", "option", "dtype", "seqlen", "expect_launch"), [
    (128, "causal", torch.bfloat16, 2048, True), (256, "causal", torch.float16, 2048, True),
    (64, "plain", torch.bfloat16, 2048, True), (64, "causal", torch.bfloat16, 1024, True),
    (96, "causal", torch.bfloat16, 2048, False), (128, "causal", torch.float32, 2048, False)])
def test_table_takes_the_hopper_kernel_where_it_fits(head_dim, option, dtype, seqlen, expect_launch, monkeypatch):
    case = make_case((1, seqlen, seqlen, 2, 2, head_dim), option, "cuda")
    with forced_ws(None, monkeypatch, expect_launch=expect_launch):
        check_against_reference(case, dtype, "cuda", flash_attn_func, backward=False)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(("seqlen", "consumers"), [(512, 1), (1024, 1), (2048, 3)])
def test_table_takes_one_consumer_then_three_for_causal_hdim_64(seqlen, consumers, monkeypatch):
    case = make_case((1, seqlen, seqlen, 2, 2, 64), "causal", "cuda")
    config = configs.lookup("hopper", "forward", 64, True, torch.bfloat16, seqlen=seqlen, hopper=True)
    assert launch_forward.consumer_warpgroups(config) == consumers
    with forced_ws(None, monkeypatch, expect_launch=True):
        check_against_reference(case, torch.bfloat16, "cuda", flash_attn_func, backward=False)
