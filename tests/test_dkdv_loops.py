"""The one-pass dK/dV kernel's other forms: one masked loop over each key block's queries
(``TileConfig.mask_every_block``), the causal diagonal peeled out of the loop (``TileConfig.peel_diagonal``),
and S and dP computed with the keys along the rows (``TileConfig.key_rows``).

The table takes them where ptxas serialized the wgmma instructions of the plain form (causal hdim 64 and 128);
these tests force each form on every head dim, against the float64 reference.
"""

import dataclasses
from contextlib import ExitStack

import pytest
import torch
from cases import DTYPES, GPU_SHAPES, INTERPRETER_SHAPES, has_tma, make_case, make_varlen_case
from test_sdpa import check_sdpa, sdpa_inputs

from flashattn import configs, flash_attn_func
from flashattn.testing import check_against_reference, check_varlen_against_reference

FORMS = {
    "every": dict(mask_every_block=True),
    "keyrows": dict(key_rows=True),
    "every-keyrows": dict(mask_every_block=True, key_rows=True),
    "peel": dict(peel_diagonal=True, mask_every_block=False),
    # the causal band peeled, a left window or an SDPA mask's block map in one loop
    "peel-every-keyrows": dict(peel_diagonal=True, mask_every_block=True, key_rows=True),
    # Q and dO through TMA descriptors (zero fill past seqlen_q): the three-loop form and the one loop
    "tma": dict(tma=True, mask_every_block=False, peel_diagonal=False),
    "every-tma": dict(tma=True, mask_every_block=True, peel_diagonal=False),
}
# BLOCK_N != BLOCK_M, so that a tile built the wrong way round fails to compile or to match
INTERPRETER_TILE = configs.TileConfig(16, 32, 1, 1)
# the options whose branches the forms change: none (the unmasked loop), causal with ALiBi and softcap (the diagonal,
# peeled or not; scores built along key rows), and a window with dropout and a scale (both window bounds, which turn
# peeling off; the dropout mask along key rows). Causal alone, a window alone and dropout alone take a subset of
# these branches (cases.OPTIONS), so they would repeat the same kernels' code
OPTION_NAMES = ["plain", "causal-alibi-softcap", "window-dropout-scale"]


def force(stack: ExitStack, form: str, device: str, dtype: torch.dtype, head_dim: int, attn_mask: bool = False):
    """``form`` on the interpreter's tile, or on a GPU on the Hopper table's causal tile for ``head_dim``."""
    tile = INTERPRETER_TILE
    if device != "cpu":
        tile = configs.lookup("hopper", "dkdv", head_dim, True, dtype, attn_mask)
        if not has_tma(device):  # the Hopper tiles' TMA
            if FORMS[form].get("tma"):
                pytest.skip("TMA needs sm90 or newer")
            tile = dataclasses.replace(tile, tma=False)
    stack.enter_context(configs.use_config("dkdv", dataclasses.replace(tile, **FORMS[form])))


def grid(shapes: list) -> list[tuple]:
    """Each form meets each option once, on shapes and dtypes that take turns: 16-bit ones for the TMA forms, whose
    loads float32 keeps as pointer loads (launch_backward.launch_backward)."""
    rows = []
    for i, form in enumerate(FORMS):
        for j, option in enumerate(OPTION_NAMES):
            dtype = DTYPES[(i + 2 * j) % len(DTYPES)]
            if FORMS[form].get("tma") and dtype == torch.float32:
                dtype = DTYPES[1 + (i + j) % 2]
            rows.append((form, shapes[(i + j) % len(shapes)], option, dtype))
    return rows


# The forms change the loops over a key block's queries, not the batch and heads a program takes (test_kernels checks
# those on cases.INTERPRETER_SHAPES): its ragged shapes, with a group of two query heads on one kv head
FORM_SHAPES = [(1, 37, 61, 2, 1, 40), *INTERPRETER_SHAPES[2:]]


@pytest.mark.interpreter
@pytest.mark.parametrize("form,shape,option_name,dtype", grid(FORM_SHAPES), ids=str)
def test_forms_match_reference(triton_backend, form, shape, option_name, dtype):
    case = make_case(shape, option_name, triton_backend)
    with ExitStack() as stack:
        force(stack, form, triton_backend, dtype, shape[-1])
        check_against_reference(case, dtype, triton_backend, flash_attn_func)


@pytest.mark.interpreter
@pytest.mark.parametrize("form", FORMS)
def test_forms_varlen_match_reference(triton_backend, form):
    # empty and one-token sequences on both sides, GQA, a 96-wide head padded to 128
    shape = ((0, 1, 20, 33), (7, 0, 20, 17), 2, 1, 96)
    with ExitStack() as stack:
        force(stack, form, triton_backend, torch.float16, shape[-1])
        check_varlen_against_reference(make_varlen_case(shape, "causal", triton_backend), torch.float16,
                                       triton_backend)


@pytest.mark.interpreter
@pytest.mark.parametrize("form", FORMS)
def test_forms_with_an_sdpa_mask(triton_backend, monkeypatch, form):
    from test_mask_skip import structured_mask

    shape = (2, 2, 1, 45, 70, 24)
    batch, nheads, _, seqlen_q, seqlen_k, _ = shape
    inputs = sdpa_inputs(*shape, torch.float32, triton_backend)
    mask = structured_mask("float-documents-grad", batch, nheads, seqlen_q, seqlen_k, triton_backend)
    with ExitStack() as stack:
        force(stack, form, triton_backend, torch.float32, shape[-1], attn_mask=True)
        check_sdpa(*inputs, mask, is_causal=True, enable_gqa=True)


# -- the GPU: each form on large shapes --


@pytest.mark.gpu
@pytest.mark.parametrize("form,shape,option_name,dtype", grid(GPU_SHAPES), ids=str)
def test_forms_match_reference_large(triton_backend, form, shape, option_name, dtype):
    case = make_case(shape, option_name, "cuda")
    with ExitStack() as stack:
        force(stack, form, "cuda", dtype, shape[-1])
        check_against_reference(case, dtype, "cuda", flash_attn_func)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_forms_varlen_large(triton_backend, form, dtype):
    shape = ((256, 129, 0, 77, 1500), (256, 300, 5, 40, 2047), 4, 2, 128)
    with ExitStack() as stack:
        force(stack, form, "cuda", dtype, shape[-1])
        check_varlen_against_reference(make_varlen_case(shape, "causal", "cuda"), dtype, "cuda")
    torch.cuda.synchronize()
