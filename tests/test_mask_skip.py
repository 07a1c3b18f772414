"""Tiles that an SDPA mask hides entirely are skipped (``flashattn.mask_blocks``), and results do not change.

The block summary and the block maps are checked against brute force; the kernels are checked on masks
with whole hidden tiles (documents, padding, causal-like, rows that see nothing, every broadcast shape)
against torch's SDPA in float64 with the tolerance rule; and NaN placed where only hidden tiles reach
shows that those tiles are never loaded (NaN x 0 would poison a tile computed under a mask).
"""

from contextlib import ExitStack

import pytest
import torch
import torch.nn.functional as F
from cases import covering
from test_sdpa import check_sdpa, sdpa_inputs

from flashattn import configs, scaled_dot_product_attention
from flashattn.launch import backward as launch_backward
from flashattn.launch import common
from flashattn.launch import forward as launch_forward
from flashattn.launch.mask_blocks import block_map, block_maps, block_summary
from flashattn.options import new_rng_state
from flashattn.reference import attention_ref
from flashattn.sdpa import attention_bhle
from flashattn.testing import assert_within_rule, score_grad_floor

# where the block-map kernel runs: the GPU, or the interpreter on CPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# every kernel the interpreter's 16 x 16 tile, also on the GPU (where the table's tiles are larger)
SMALL_TILES = {phase: configs.TileConfig(16, 16, 1, 1) for phase in ("forward", "dkdv", "dq")}
# each kernel a different tile, as on the GPU: the backward's two maps come from one finer summary
MIXED_TILES = {"forward": configs.TileConfig(32, 16, 1, 1), "dkdv": configs.TileConfig(16, 32, 1, 1),
               "dq": configs.TileConfig(32, 16, 1, 1)}


def use_tiles(stack, tiles: dict | None) -> None:
    for phase, config in (tiles or {}).items():
        stack.enter_context(configs.use_config(phase, config))


def structured_mask(kind: str, batch: int, nheads: int, seqlen_q: int, seqlen_k: int, device,
                    dtype=torch.float32) -> torch.Tensor:
    """Masks whose hidden scores cover whole tiles, at any sequence lengths (boundaries not tile-aligned)."""
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    batches = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    documents = (i * 3 // seqlen_q) == (j * 3 // seqlen_k)  # 3 documents, split at the same fractions
    if kind == "block-diagonal":
        return documents
    if kind == "right-padding":  # batch b keeps its first Lk - 2b Lk / 5 keys
        return j < seqlen_k - batches * seqlen_k * 2 // 5
    if kind == "left-padding":
        return j >= batches * seqlen_k * 2 // 5
    if kind == "causal-bool":  # bottom-right: with Lq > Lk the top rows see no key
        return j <= i + (seqlen_k - seqlen_q)
    if kind == "sliding-bool":  # each head its own window
        widths = (torch.arange(nheads, device=device) + 1).view(1, nheads, 1, 1) * max(1, seqlen_k // 6)
        diagonal = i + (seqlen_k - seqlen_q)
        return (j <= diagonal) & (j > diagonal - widths)
    if kind == "empty-rows":  # random, with whole query blocks, single rows and a key range hidden
        keep = torch.rand(batch, nheads, seqlen_q, seqlen_k, device=device) > 0.3
        keep[:, :, seqlen_q // 3: seqlen_q // 3 + max(1, seqlen_q // 4)] = False
        keep[:, :, [0, seqlen_q - 1]] = False
        keep[..., seqlen_k // 2: seqlen_k // 2 + max(1, seqlen_k // 5)] = False
        keep[1:, 1:] = False  # one (batch, head) sees nothing at all
        return keep
    if kind == "row-flags":  # (B, H, Lq, 1): a row sees every key or none
        return torch.rand(batch, nheads, seqlen_q, 1, device=device) > 0.4
    if kind == "expanded":  # a stride-0 view of a (Lq, Lk) mask
        return documents.expand(batch, nheads, seqlen_q, seqlen_k)
    if kind == "float-documents-grad":
        bias = torch.randn(1, nheads, seqlen_q, seqlen_k, device=device, dtype=dtype)
        return bias.masked_fill(~documents, float("-inf")).requires_grad_()
    raise ValueError(kind)


KINDS = ["block-diagonal", "right-padding", "left-padding", "causal-bool", "sliding-bool", "empty-rows",
         "row-flags", "expanded", "float-documents-grad"]


# -- the summary and the maps, against brute force --


def brute_summary(mask: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """Pad to whole tiles with hidden scores, then look at every tile: O(Lq x Lk) memory, for the tests."""
    visible = mask if mask.dtype == torch.bool else mask != float("-inf")
    rows, cols = visible.shape[2:]
    padded = F.pad(visible, (0, -cols % block_n, 0, -rows % block_m), value=False)
    tiles = padded.unflatten(3, (-1, block_n)).unflatten(2, (-1, block_m))
    return tiles.any(dim=(3, 5))


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (16, 64), (1, 8)])
@pytest.mark.parametrize("shape", [(1, 1, 37, 53), (2, 1, 37, 53), (2, 1, 1, 53), (1, 3, 16, 64), (2, 3, 37, 1),
                                   (1, 1, 1, 1)], ids=str)
@pytest.mark.parametrize("kind", ["bool", "float", "float16"])
def test_block_summary_matches_brute_force(kind, shape, block_m, block_n):
    visible = torch.rand(shape) > 0.97  # sparse: some tiles hidden, some not
    visible[..., : shape[2] // 2, -(shape[3] // 3):] = True
    if kind == "bool":
        mask = visible
    else:
        mask = torch.randn(shape, dtype=torch.float16 if kind == "float16" else torch.float32)
        mask = mask.masked_fill(~visible, float("-inf"))
    summary = block_summary(mask, block_m, block_n)
    assert summary.dtype == torch.bool
    assert torch.equal(summary, brute_summary(mask, block_m, block_n))


def test_block_summary_keeps_broadcast_dims_at_one():
    documents = structured_mask("block-diagonal", 1, 1, 45, 70, "cpu")
    expanded = documents.expand(3, 4, 45, 70)  # stride 0: summarized once
    summary = block_summary(expanded, 16, 16)
    assert summary.shape == (1, 1, 3, 5)
    assert torch.equal(summary, brute_summary(documents[None, None], 16, 16))
    padding = structured_mask("right-padding", 2, 1, 45, 70, "cpu")  # (2, 1, 1, 70)
    assert block_summary(padding, 16, 32).shape == (2, 1, 1, 3)
    assert block_summary(structured_mask("row-flags", 2, 3, 45, 70, "cpu"), 16, 32).shape == (2, 3, 3, 1)


def test_float_mask_summary_treats_nan_as_visible():
    mask = torch.full((1, 1, 20, 20), float("-inf"))
    mask[0, 0, 3, 17] = float("nan")  # computing it gives NaN, as it should: it must not be skipped
    mask[0, 0, 18, 2] = -1e30  # tiny, not hidden
    assert block_summary(mask, 16, 16)[0, 0].tolist() == [[False, True], [True, False]]


def test_coarser_tiles_from_a_finer_summary():
    mask = torch.rand(2, 3, 77, 91) > 0.995
    fine = block_summary(mask, 8, 16)
    for block_m, block_n in ((16, 16), (32, 64), (8, 32)):
        assert torch.equal(block_summary(fine, block_m // 8, block_n // 16), block_summary(mask, block_m, block_n))


def reference_map_row(visible_row: list[bool]) -> list[int]:
    """Counts before each block, the visible blocks, then the hidden ones (never read by the kernels)."""
    listed = [j for j, seen in enumerate(visible_row) if seen]
    hidden = [j for j, seen in enumerate(visible_row) if not seen]
    before = [sum(visible_row[:j]) for j in range(len(visible_row) + 1)]
    return before + listed + hidden


@pytest.mark.parametrize("transpose", [False, True], ids=["rows-are-queries", "rows-are-keys"])
def test_block_map_lists_the_visible_blocks(transpose):
    summary = torch.rand(2, 1, 5, 7, device=DEVICE) > 0.6
    summary[0, 0, 1] = False  # a row with nothing visible
    summary[1, 0, :, 2] = False
    rows, columns = (7, 5) if transpose else (5, 7)
    result = block_map(summary, rows, columns, transpose)
    assert result.dtype == torch.int32 and result.shape == (2, 1, rows, 2 * columns + 1) and result.is_contiguous()
    tiles = summary.transpose(2, 3) if transpose else summary
    for b in range(2):
        for r in range(rows):
            expected = reference_map_row(tiles[b, 0, r].tolist())
            assert result[b, 0, r].tolist() == expected


def test_block_map_expands_broadcast_tile_dims():
    padding = block_summary(structured_mask("left-padding", 2, 1, 45, 70, DEVICE), 16, 16)  # (2, 1, 1, 5)
    forward = block_map(padding, 3, 5)
    assert torch.equal(forward[:, :, 0], forward[:, :, 2])
    dkdv = block_map(padding, 5, 3, transpose=True)
    # a key block with no visible key has no query block to visit; the others visit all three
    assert dkdv[1, 0, :, 3].tolist() == [0, 3, 3, 3, 3]  # keys < 28 hidden: block 0 only is all hidden


def test_block_maps_from_one_summary_match_per_kernel_summaries():
    mask = structured_mask("sliding-bool", 2, 3, 100, 130, DEVICE)
    tiles = [(64, 16, True), (32, 64, False), (16, 16, False)]
    for (block_m, block_n, rows_are_keys), result in zip(tiles, block_maps(mask, 100, 130, *tiles), strict=True):
        query_blocks, key_blocks = -(-100 // block_m), -(-130 // block_n)
        direct = block_summary(mask, block_m, block_n)
        shape = (key_blocks, query_blocks) if rows_are_keys else (query_blocks, key_blocks)
        assert torch.equal(result, block_map(direct, *shape, transpose=rows_are_keys))


def test_block_map_arguments():
    q = torch.randn(2, 45, 2, 16, device=DEVICE)
    mask = structured_mask("block-diagonal", 2, 2, 45, 70, DEVICE)[None, None]  # as the op gets it: 4 dims
    (arguments,) = common.block_map_arguments(mask, q, 70, (16, 16, False))
    assert arguments["HAS_BLOCK_MAP"] and arguments["BlockMap"].shape == (2, 2, 3, 11)
    assert arguments["stride_map_b"] == 0 and arguments["stride_map_h"] == 0  # a (Lq, Lk) mask broadcasts
    (arguments,) = common.block_map_arguments(None, q, 70, (16, 16, False))
    assert not arguments["HAS_BLOCK_MAP"]


def compute_every_tile(monkeypatch) -> None:
    """The launchers without block maps: every tile computed, as without skipping."""

    def no_maps(attn_mask, q, seqlen_k, *tiles):
        return common.block_map_arguments(None, q, seqlen_k, *tiles)

    monkeypatch.setattr(launch_forward, "block_map_arguments", no_maps)
    monkeypatch.setattr(launch_backward, "block_map_arguments", no_maps)


# -- the kernels on masks with hidden tiles: torch's SDPA in float64 is the oracle --

SHAPES = [(2, 2, 1, 45, 70, 16), (2, 2, 2, 70, 45, 24)]  # (batch, heads, heads_k, Lq, Lk, E)


# Each kind once, the shapes taking turns (GQA or not, more queries or more keys): a kind is mask data and a
# stride pattern, and the kernels' branches are bool or float, with or without a gradient, which several kinds share
@pytest.mark.interpreter
@pytest.mark.parametrize("shape,kind", [(SHAPES[i % len(SHAPES)], kind) for i, kind in enumerate(KINDS)], ids=str)
def test_masks_with_hidden_tiles_match_torch(triton_backend, shape, kind):
    batch, nheads, nheads_k, seqlen_q, seqlen_k, _ = shape
    inputs = sdpa_inputs(*shape, torch.float32, triton_backend)
    mask = structured_mask(kind, batch, nheads, seqlen_q, seqlen_k, triton_backend)
    check_sdpa(*inputs, mask, enable_gqa=nheads != nheads_k)


# Pairwise (cases.covering): each kind with and without is_causal and in both dtypes
@pytest.mark.interpreter
@pytest.mark.parametrize("kind,is_causal,dtype", covering(
    ["block-diagonal", "left-padding", "empty-rows", "float-documents-grad"], [False, True],
    [torch.float32, torch.float16]), ids=str)
def test_mixed_tiles_and_causal(triton_backend, kind, dtype, is_causal):
    """Each kernel its own tile (one summary reduced per kernel), with and without is_causal's window."""
    shape = (2, 2, 1, 45, 70, 16) if is_causal else (2, 2, 1, 70, 45, 16)
    batch, nheads, _, seqlen_q, seqlen_k, _ = shape
    inputs = sdpa_inputs(*shape, dtype, triton_backend)
    mask = structured_mask(kind, batch, nheads, seqlen_q, seqlen_k, triton_backend, dtype)
    with ExitStack() as stack:
        use_tiles(stack, MIXED_TILES)
        check_sdpa(*inputs, mask, is_causal=is_causal, enable_gqa=True)


def check_against_reference(run, inputs, dropout_p: float = 0.0, **reference_options) -> None:
    """``run(query, key, value)`` (flashattn, (B, H, L, E)) within the rule of ``attention_ref`` with
    ``reference_options`` in float64, outputs and gradients (the dropout stream drawn after seed 0)."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    torch.manual_seed(0)
    out = run(*leaves)
    torch.manual_seed(0)
    rng_state = new_rng_state() if dropout_p > 0 else None

    def reference(upcast: bool):
        ref_leaves = [(x.double() if upcast else x).detach().clone().requires_grad_() for x in inputs]
        ref_out, _ = attention_ref(*(x.transpose(1, 2) for x in ref_leaves), dropout_p=dropout_p,
                                   rng_state=rng_state, upcast=upcast, **reference_options)
        return ref_leaves, ref_out.transpose(1, 2)

    (oracle_leaves, oracle), (baseline_leaves, baseline) = reference(True), reference(False)
    assert_within_rule("out", out, oracle, baseline, factor=2)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    oracle_grads = torch.autograd.grad(oracle, oracle_leaves, dout.double())
    baseline_grads = torch.autograd.grad(baseline, baseline_leaves, dout)
    scale = inputs[0].shape[-1] ** -0.5
    floor = score_grad_floor(dout, out, oracle, inputs[2], dropout_p) * max(
        inputs[0].abs().max(), inputs[1].abs().max()).item() * scale
    for name, grad, oracle_grad, baseline_grad in zip(("dq", "dk", "dv"), grads, oracle_grads, baseline_grads,
                                                      strict=True):
        assert_within_rule(name, grad, oracle_grad, baseline_grad, factor=3, floor=floor)


@pytest.mark.interpreter
@pytest.mark.parametrize("sliding_window", [9, 30])
def test_sliding_window_with_padding_mask(triton_backend, sliding_window):
    """A left window (the kernels' WINDOW_LEFT bounds) cut further by the map of a padding mask (each sequence its
    own: two sequences, one head)."""
    inputs = sdpa_inputs(2, 1, 1, 61, 61, 16, torch.float32, triton_backend)
    mask = structured_mask("left-padding", 2, 1, 61, 61, triton_backend)
    check_against_reference(
        lambda q, k, v: attention_bhle(q, k, v, mask, 0.0, True, None, sliding_window=sliding_window),
        inputs, attn_mask=mask, window_size=(sliding_window - 1, 0))


@pytest.mark.interpreter
@pytest.mark.parametrize("kind", ["block-diagonal", "empty-rows"])
def test_dropout_with_hidden_tiles_replays_the_reference(triton_backend, kind):
    """Skipped tiles leave the dropout stream where it was: each score's counter is its position."""
    inputs = sdpa_inputs(2, 2, 2, 45, 70, 16, torch.float32, triton_backend)
    mask = structured_mask(kind, 2, 2, 45, 70, triton_backend)
    check_against_reference(lambda q, k, v: scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3),
                            inputs, dropout_p=0.3, attn_mask=mask)


@pytest.mark.interpreter
@pytest.mark.parametrize("kind", ["bool", "float-grad"])
def test_a_mask_that_hides_everything_gives_zeros(triton_backend, kind):
    query, key, value = (x.requires_grad_() for x in sdpa_inputs(1, 2, 2, 20, 33, 16, torch.float32,
                                                                  triton_backend))
    mask = torch.zeros(1, 1, 20, 33, dtype=torch.bool, device=triton_backend)
    if kind == "float-grad":
        mask = torch.full((1, 1, 20, 33), float("-inf"), device=triton_backend).requires_grad_()
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask)
    assert torch.equal(out, torch.zeros_like(out))
    out.backward(torch.randn_like(out))
    for x in (query, key, value) + ((mask,) if kind == "float-grad" else ()):
        assert torch.equal(x.grad, torch.zeros_like(x.grad))


# -- hidden tiles are never loaded: NaN that only hidden tiles reach does not poison anything --


def checkerboard_nan_case(batch, nheads, seqlen, head_dim, granularity, dtype, device):
    """Blocks of ``granularity`` queries and keys: query block a sees key block b when a = b mod 2.

    The odd blocks' Q, K, V and dO are NaN: the even queries' out and dQ, and the even keys' dK and dV,
    depend only on even blocks, and every tile pairing an even block with an odd one is hidden.
    """
    query, key, value = sdpa_inputs(batch, nheads, nheads, seqlen, seqlen, head_dim, dtype, device)
    dout = torch.randn_like(query)
    parity = torch.arange(seqlen, device=device) // granularity % 2
    mask = parity[:, None] == parity[None, :]
    odd = parity == 1
    poisoned = [x.clone() for x in (query, key, value, dout)]
    for x in poisoned:
        x[:, :, odd] = float("nan")
    return (query, key, value, dout), poisoned, mask, ~odd


def run_with_grads(query, key, value, dout, mask):
    leaves = [x.detach().requires_grad_() for x in (query, key, value)]
    out = scaled_dot_product_attention(*leaves, attn_mask=mask)
    return (out, *torch.autograd.grad(out, leaves, dout))


def assert_skipped(batch, nheads, seqlen, head_dim, granularity, dtype, device, monkeypatch):
    clean, poisoned, mask, even = checkerboard_nan_case(batch, nheads, seqlen, head_dim, granularity, dtype,
                                                        device)
    expected = check_sdpa(*clean[:3], mask, dout=clean[3])  # the clean run, itself right
    results = run_with_grads(*poisoned, mask)
    for name, result, reference in zip(("out", "dq", "dk", "dv"), results, expected, strict=True):
        # the same tiles in the same order: bit for bit the clean run's values
        assert torch.equal(result[:, :, even], reference[:, :, even]), f"{name}: a hidden tile was computed"
        assert torch.isnan(result[:, :, ~even]).any(), f"{name}: the odd blocks should see the NaN"
    # control: computing every tile lets NaN x 0 through, so the check above does see skipping
    compute_every_tile(monkeypatch)
    unskipped = run_with_grads(*poisoned, mask)
    assert all(torch.isnan(x[:, :, even]).any() for x in unskipped)


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the odd blocks' rows, under the interpreter
@pytest.mark.parametrize("tiles,granularity", [(SMALL_TILES, 16), (MIXED_TILES, 32)], ids=["16x16", "mixed"])
def test_hidden_tiles_are_never_loaded(triton_backend, monkeypatch, tiles, granularity):
    with ExitStack() as stack:
        use_tiles(stack, tiles)
        # three blocks a side, the last ragged: hidden (even, odd) tiles on both sides of the diagonal; one head (the
        # tiles a program skips are the same for every head; the GPU test takes several)
        assert_skipped(1, 1, 3 * granularity - 7, 16, granularity, torch.float32, triton_backend, monkeypatch)


# -- the GPU grid (next to tests/test_sdpa.py's): the table's tiles, large shapes --

GPU_SHAPES = [(2, 8, 2, 1023, 1024, 128), (1, 4, 4, 257, 2049, 64), (2, 4, 1, 2048, 511, 256),
              (1, 2, 2, 4096, 4096, 96)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# Pairwise (cases.covering): each kind on each shape; is_causal and the dtypes take turns
@pytest.mark.gpu
@pytest.mark.parametrize("kind,shape,is_causal,dtype", covering(KINDS, GPU_SHAPES, [False, True], DTYPES), ids=str)
def test_masks_with_hidden_tiles_large(triton_backend, shape, kind, is_causal, dtype):
    batch, nheads, nheads_k, seqlen_q, seqlen_k, _ = shape
    inputs = sdpa_inputs(*shape, dtype, "cuda")
    mask = structured_mask(kind, batch, nheads, seqlen_q, seqlen_k, "cuda", dtype)
    check_sdpa(*inputs, mask, is_causal=is_causal, enable_gqa=nheads != nheads_k)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_hidden_tiles_are_never_loaded_gpu(triton_backend, monkeypatch, head_dim, dtype):
    # 128-wide blocks hide whole tiles of every kernel: the table's tiles are at most 128
    assert_skipped(2, 4, 1000, head_dim, 128, dtype, "cuda", monkeypatch)
    torch.cuda.synchronize()
