"""The dK/dV phase in two passes (``TileConfig.split_dkdv``): a dV pass, then a dK pass, each with one
accumulator and the keys along its tile's rows (``dkdv_kernel``'s COMPUTE_DK, COMPUTE_DV, KEY_ROWS).

No table entry splits any more (the one-pass hdim-256 tile timed faster); these tests force the split
on every head dim, through the same checks as the one-pass kernel: the option grid against the float64
reference, varlen batches, SDPA masks with and without block maps, and tiles a mask hides never being
loaded.
"""

import dataclasses
from contextlib import ExitStack

import pytest
import torch
from cases import DTYPES, GPU_SHAPES, INTERPRETER_SHAPES, OPTIONS, make_case, make_varlen_case
from test_mask_skip import assert_skipped, structured_mask
from test_sdpa import check_sdpa, sdpa_inputs

from flashattn import configs, flash_attn_func, ops
from flashattn.testing import check_against_reference, check_varlen_against_reference

# BLOCK_N != BLOCK_M, so that a tile built the wrong way round fails to compile or to match
SPLIT_INTERPRETER = configs.TileConfig(16, 32, 1, 1, split_dkdv=True)


def split_tiles(device: str, dtype: torch.dtype, attn_mask: bool = False) -> configs.TileConfig:
    """The split tiles to force: the interpreter's, or on a GPU the Hopper split tile, fitted like a table entry."""
    if device == "cpu":
        return SPLIT_INTERPRETER
    return configs.fitted(configs.HOPPER_SPLIT_DKDV, dtype, attn_mask)


def forced(stack: ExitStack, device: str, dtype: torch.dtype, attn_mask: bool = False) -> None:
    stack.enter_context(configs.use_config("dkdv", split_tiles(device, dtype, attn_mask)))


def latin_grid(shapes: list) -> list[tuple]:
    """Every shape meets every option once, with the dtypes taking turns: each option runs in each dtype
    on some shape (given 3 shapes or more), at a third of the full grid's cost."""
    return [(shape, option, DTYPES[(i + j) % len(DTYPES)])
            for i, shape in enumerate(shapes) for j, option in enumerate(OPTIONS)]


@pytest.mark.interpreter
@pytest.mark.parametrize("shape,option_name,dtype", latin_grid(INTERPRETER_SHAPES), ids=str)
def test_split_kernels_match_reference(triton_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, triton_backend)
    with ExitStack() as stack:
        forced(stack, triton_backend, dtype)
        check_against_reference(case, dtype, triton_backend, flash_attn_func)


@pytest.mark.interpreter
@pytest.mark.parametrize("option_name", ["plain", "causal", "causal-alibi-softcap", "window-dropout-scale"])
def test_split_varlen_matches_reference(triton_backend, option_name):
    # empty and one-token sequences on both sides, GQA, a 96-wide head padded to 128
    shape = ((0, 1, 20, 33), (7, 0, 20, 17), 2, 1, 96)
    with ExitStack() as stack:
        forced(stack, triton_backend, torch.float16)
        check_varlen_against_reference(make_varlen_case(shape, option_name, triton_backend), torch.float16,
                                       triton_backend)


@pytest.mark.interpreter
@pytest.mark.parametrize("skip_hidden_tiles", [True, False], ids=["block-maps", "no-maps"])
@pytest.mark.parametrize("kind,is_causal", [("empty-rows", False), ("float-documents-grad", True),
                                            ("sliding-bool", False)])
def test_split_with_sdpa_masks(triton_backend, monkeypatch, kind, is_causal, skip_hidden_tiles):
    monkeypatch.setattr(ops, "SKIP_HIDDEN_TILES", skip_hidden_tiles)
    shape = (2, 2, 1, 45, 70, 24)
    batch, nheads, _, seqlen_q, seqlen_k, _ = shape
    inputs = sdpa_inputs(*shape, torch.float32, triton_backend)
    mask = structured_mask(kind, batch, nheads, seqlen_q, seqlen_k, triton_backend)
    with ExitStack() as stack:
        forced(stack, triton_backend, torch.float32, attn_mask=True)
        check_sdpa(*inputs, mask, is_causal=is_causal, enable_gqa=True)


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the odd blocks' rows, under the interpreter
def test_split_passes_never_load_hidden_tiles(triton_backend, monkeypatch):
    # a block of the checkerboard must hide whole tiles of every kernel: on a GPU the table's dQ tile and the
    # split dK/dV tile are wider than the interpreter's 32
    granularity, seqlen = (32, 57) if triton_backend == "cpu" else (128, 1000)
    with ExitStack() as stack:
        forced(stack, triton_backend, torch.float32, attn_mask=True)
        assert_skipped(1, 2, seqlen, 16, granularity, torch.float32, triton_backend, monkeypatch)


def test_a_split_config_launches_a_dv_pass_then_a_dk_pass():
    one_pass = configs.TileConfig(64, 64, 4, 2)
    loops = {"MASK_EVERY_BLOCK": False, "PEEL_DIAGONAL": False}
    assert ops._dkdv_passes(one_pass) == ({**loops, "KEY_ROWS": False},)
    dv_pass, dk_pass = ops._dkdv_passes(dataclasses.replace(one_pass, split_dkdv=True))
    assert dv_pass == {"COMPUTE_DK": False, "KEY_ROWS": True, **loops}
    assert dk_pass == {"COMPUTE_DV": False, "KEY_ROWS": True, **loops}


# -- the GPU: the table's split tiles forced on every head dim, large shapes --


@pytest.mark.gpu
@pytest.mark.parametrize("shape,option_name,dtype", latin_grid(GPU_SHAPES), ids=str)
def test_split_kernels_match_reference_large(triton_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, "cuda")
    with ExitStack() as stack:
        forced(stack, "cuda", dtype)
        check_against_reference(case, dtype, "cuda", flash_attn_func)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("option_name", ["plain", "causal", "window-dropout-scale"])
def test_split_varlen_large(triton_backend, option_name, dtype):
    shape = ((256, 129, 0, 77, 1500), (256, 300, 5, 40, 2047), 4, 2, 256)
    with ExitStack() as stack:
        forced(stack, "cuda", dtype)
        check_varlen_against_reference(make_varlen_case(shape, option_name, "cuda"), dtype, "cuda")
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", ["empty-rows", "sliding-bool", "float-documents-grad"])
def test_split_with_sdpa_masks_large(triton_backend, kind, is_causal, dtype):
    shape = (2, 4, 1, 2048, 511, 256)
    batch, nheads, _, seqlen_q, seqlen_k, _ = shape
    inputs = sdpa_inputs(*shape, dtype, "cuda")
    mask = structured_mask(kind, batch, nheads, seqlen_q, seqlen_k, "cuda", dtype)
    with ExitStack() as stack:
        forced(stack, "cuda", dtype, attn_mask=True)
        check_sdpa(*inputs, mask, is_causal=is_causal, enable_gqa=True)
    torch.cuda.synchronize()
