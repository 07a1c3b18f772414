"""flash_attn_varlen_func with a block_table: packed queries over paged keys (forward only).

A paged call must give the unpaged call's result on the same keys: bitwise on the torch path (the same
arithmetic on the gathered keys), and on the interpreter too (the same kernel on the same values: only
the row addresses differ), and within the tolerance rule of the float64 reference everywhere. Every
row that no key owns is NaN and every table entry past a sequence's last page is out of range
(``testing.page_keys``), so reading one of them would show.
"""

import functools
import itertools

import pytest
import torch
from cases import COMPILE_BACKEND, DTYPES, covering, heavy_varlen_reference, make_varlen_case, one_at_a_time

from flashattn import configs, flash_attn_varlen_func, ops, validation
from flashattn.launch import forward as launch_forward
from flashattn.options import AttentionOptions
from flashattn.testing import VarlenCase, check_varlen_against_reference, page_keys

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAGE_SIZES = [16, 32, 64]
# options that change which keys a block sees or how scores are formed; dropout checks the packed stream
PAGED_OPTIONS = ["plain", "causal", "window", "softcap", "causal-alibi-softcap", "dropout"]

# (seqlens_q, seqlens_k, nheads, nheads_k, head_dim): sequences of 0 and 1 keys, keys ending mid-page
# and on a page edge, Sq > Sk and Sq < Sk, GQA
TORCH_SHAPES = [
    ((0, 1, 37, 113), (5, 1, 0, 203), 4, 2, 40),
    ((1, 1, 9), (1, 64, 130), 2, 1, 96),
    ((70, 3, 17), (32, 90, 17), 3, 3, 64),
]
INTERPRETER_SHAPES = [
    ((0, 1, 20, 33), (7, 0, 20, 17), 2, 1, 40),
    ((5, 1), (64, 1), 4, 2, 16),
]
GPU_SHAPES = [
    ((0, 1, 2048, 517, 1000, 1, 64, 1999), (0, 1, 2048, 517, 1000, 1, 64, 1999), 8, 2, 128),
    ((113, 1, 1, 1, 7), (4099, 1, 256, 300, 0), 8, 1, 64),
    ((1, 333, 1500, 2047), (1700, 1, 1500, 900), 6, 2, 96),
    ((256, 129, 0, 77), (256, 300, 5, 40), 2, 1, 256),
]


def paged_and_packed(case: VarlenCase, dtype: torch.dtype, page_size: int, device=DEVICE, seed: int = 0):
    """Run ``case`` on paged keys and on the same keys packed: (paged out, paged lse, packed out, packed lse)."""
    torch.manual_seed(seed)
    cu_q, cu_k = case.cu_seqlens(device)
    q, k, v = case.random_inputs(dtype, device)
    k_pages, v_pages, table = page_keys(k, v, cu_k, page_size, seed=seed)
    call = functools.partial(flash_attn_varlen_func, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                             max_seqlen_q=max(case.seqlens_q), max_seqlen_k=max(case.seqlens_k),
                             return_attn_probs=True, **case.options)
    torch.manual_seed(1)  # the same dropout seed for both calls
    out, lse, _ = call(q, k_pages, v_pages, block_table=table)
    torch.manual_seed(1)
    expected_out, expected_lse, _ = call(q, k, v)
    return out, lse, expected_out, expected_lse


def assert_same(paged, packed) -> None:
    for name, actual, expected in zip(("out", "lse"), paged, packed, strict=True):
        assert torch.equal(actual, expected), f"{name}: paged differs from packed by " \
            f"{(actual.double() - expected.double()).abs().nan_to_num(float('inf')).max().item():.3e}"


# ---------------------------------------------------------------------------------------------
# Paged keys against the same keys packed
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,option_name,page_size", covering(TORCH_SHAPES, PAGED_OPTIONS, PAGE_SIZES), ids=str)
def test_torch_path_paged_equals_packed(torch_backend, shape, option_name, page_size):
    case = make_varlen_case(shape, option_name, "cpu")
    out, lse, expected_out, expected_lse = paged_and_packed(case, torch.float16, page_size, "cpu")
    assert_same((out, lse), (expected_out, expected_lse))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_path_paged_equals_packed_in_every_dtype(torch_backend, dtype):
    case = make_varlen_case(TORCH_SHAPES[0], "causal", "cpu")
    out, lse, expected_out, expected_lse = paged_and_packed(case, dtype, 32, "cpu")
    assert_same((out, lse), (expected_out, expected_lse))


# Each option once, the page sizes taking turns: under the interpreter's 16-wide key blocks every page size takes
# the same branch (ONE_PAGE), so a page size per option is enough
@pytest.mark.interpreter
@pytest.mark.parametrize("option_name,page_size", [
    (option_name, PAGE_SIZES[i % len(PAGE_SIZES)])
    for i, option_name in enumerate(["causal", "window", "causal-alibi-softcap", "dropout"])])
def test_kernels_paged_equal_packed(triton_backend, option_name, page_size):
    # the interpreter's 16-wide key blocks divide every page: one table read per block (ONE_PAGE)
    case = make_varlen_case(INTERPRETER_SHAPES[0], option_name, triton_backend)
    out, lse, expected_out, expected_lse = paged_and_packed(case, torch.float16, page_size, triton_backend)
    assert_same((out, lse), (expected_out, expected_lse))


# Each tile with one option and each option once (not their product): the branch is ONE_PAGE off, which every
# tile takes, and the options' branches are the ones of the other tests
@pytest.mark.interpreter
@pytest.mark.parametrize("block_n,page_size,option_name", [(32, 16, "plain"), (64, 16, "causal"),
                                                          (64, 32, "window-dropout-scale")])
def test_kernels_blocks_wider_than_a_page(triton_backend, block_n, page_size, option_name):
    # a key block spans several pages: one table read per row, clamped to the sequence's last page
    case = make_varlen_case(INTERPRETER_SHAPES[0], option_name, triton_backend)
    with configs.use_config("forward", configs.TileConfig(16, block_n, 1, 1)):
        out, lse, expected_out, expected_lse = paged_and_packed(case, torch.float32, page_size, triton_backend)
    assert_same((out, lse), (expected_out, expected_lse))


@pytest.mark.interpreter
def test_kernels_never_take_tma_for_pages(triton_backend):
    # a TMA tile in the table (hdim 128 non-causal on Hopper) becomes a pointer-load tile for a paged call
    case = make_varlen_case(INTERPRETER_SHAPES[1], "plain", triton_backend)
    with configs.use_config("forward", configs.TileConfig(16, 128, 1, 1, tma=True)):
        paged = paged_and_packed(case, torch.float16, 16, triton_backend)[:2]
    with configs.use_config("forward", configs.TileConfig(16, 64, 1, 1)):
        packed = paged_and_packed(case, torch.float16, 16, triton_backend)[2:]
    assert_same(paged, packed)


# ---------------------------------------------------------------------------------------------
# Against the float64 reference (the tolerance rule)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("option_name", PAGED_OPTIONS)
def test_torch_path_matches_reference(torch_backend, option_name, dtype):
    case = make_varlen_case(TORCH_SHAPES[0], option_name, "cpu")
    check_varlen_against_reference(case, dtype, "cpu", backward=False, page_size=16)


# Each option on each shape, the page sizes taking turns (one branch under the interpreter: ONE_PAGE)
@pytest.mark.interpreter
@pytest.mark.parametrize("option_name,shape,page_size", [
    (option_name, shape, PAGE_SIZES[n % len(PAGE_SIZES)])
    for n, (option_name, shape) in enumerate(itertools.product(PAGED_OPTIONS, INTERPRETER_SHAPES))], ids=str)
def test_kernels_match_reference(triton_backend, shape, option_name, page_size):
    case = make_varlen_case(shape, option_name, triton_backend)
    check_varlen_against_reference(case, torch.float16, triton_backend, backward=False, page_size=page_size)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kernels_match_reference_other_dtypes(triton_backend, dtype):
    case = make_varlen_case(INTERPRETER_SHAPES[0], "causal-alibi-softcap", triton_backend)
    check_varlen_against_reference(case, dtype, triton_backend, backward=False, page_size=32)


# Pairwise (cases.covering): each option on each shape; page sizes and dtypes take turns, each meeting every
# shape, every option and each other
@pytest.mark.gpu
@pytest.mark.parametrize("shape,option_name,page_size,dtype", one_at_a_time(covering(
    GPU_SHAPES, ["plain", "causal", "window", "causal-alibi-softcap", "dropout"], [16, 64, 256], DTYPES),
    lambda shape, option_name, page_size, dtype: heavy_varlen_reference(shape, dtype)), ids=str)
def test_kernels_match_reference_large(triton_backend, shape, option_name, page_size, dtype):
    # pages narrower than the key block (16; 64 under 128-wide blocks): a table read per row; 256: per block
    case = make_varlen_case(shape, option_name, "cuda")
    check_varlen_against_reference(case, dtype, "cuda", backward=False, page_size=page_size)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 256])
def test_kernels_paged_equal_packed_large(triton_backend, page_size):
    # hdim 64 forward on the Triton tile of pointer loads for both (no TMA tile; the table would give the packed call
    # the Hopper kernel), so that the same values meet the same code
    case = make_varlen_case(GPU_SHAPES[1], "causal", "cuda")
    with configs.use_config("forward", configs.HOPPER_FORWARD.shortest[(64, True)]):
        out, lse, expected_out, expected_lse = paged_and_packed(case, torch.bfloat16, page_size, "cuda")
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, expected_lse, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# The API: forward only, max_seqlen forms, padding entries, custom op
# ---------------------------------------------------------------------------------------------


def test_backward_is_refused(backend):
    case = VarlenCase((3, 4), (20, 1), 2, 1, 16)
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    q, k, v = case.random_inputs(torch.float32, DEVICE)
    k_pages, v_pages, table = page_keys(k, v, cu_k, 16)
    q.requires_grad_()
    out = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 4, 20, block_table=table)
    assert out.requires_grad  # a forward with inputs that need grad still runs (inference under autograd)
    with pytest.raises(RuntimeError, match="block_table .* is forward only"):
        out.sum().backward()


def test_max_seqlen_as_tensor_or_larger_bound(backend):
    case = VarlenCase((5, 0, 23), (9, 4, 23), 2, 1, 32, {"causal": True})
    check_varlen_against_reference(case, torch.float32, DEVICE, backward=False, page_size=16,
                                   max_seqlens=(torch.tensor(23), torch.tensor(23)))
    # a loose bound within the table's capacity (2 pages of 16 + one column of padding)
    check_varlen_against_reference(case, torch.float32, DEVICE, backward=False, page_size=16, max_seqlens=(40, 48))


def test_only_empty_key_sequences(backend):
    case = VarlenCase((3, 2), (0, 0), 2, 2, 16)
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    q, k, v = case.random_inputs(torch.float32, DEVICE)
    k_pages, v_pages, table = page_keys(k, v, cu_k, 16)
    out, lse, _ = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 3, 0, block_table=table,
                                         return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(q)) and torch.isinf(lse).all()


def test_shared_pages_and_strided_pools(backend):
    # two sequences read the same pages (a shared prefix), from pools that are views into wider tensors
    page_size, nheads_k, head_dim = 16, 2, 24
    wide = [torch.randn(6, page_size, 5, head_dim, device=DEVICE) for _ in range(2)]
    k_pages, v_pages = (x[:, :, 1:3] for x in wide)
    assert not k_pages.is_contiguous()
    table = torch.tensor([[4, 1, 0], [4, 1, 5]], dtype=torch.int32, device=DEVICE)
    case = VarlenCase((7, 12), (40, 48), 4, nheads_k, head_dim, {"causal": True})
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    q = torch.randn(19, 4, head_dim, device=DEVICE)
    out = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 12, 48, causal=True, block_table=table)
    rows = [k_pages[table[b].long()].flatten(0, 1)[:n] for b, n in enumerate(case.seqlens_k)]
    values = [v_pages[table[b].long()].flatten(0, 1)[:n] for b, n in enumerate(case.seqlens_k)]
    expected = flash_attn_varlen_func(q, torch.cat(rows), torch.cat(values), cu_q, cu_k, 12, 48, causal=True)
    assert torch.equal(out, expected)


def test_custom_op_passes_opcheck(torch_backend):
    case = VarlenCase((3, 0, 5), (20, 4, 33), 4, 2, 16)
    cu_q, cu_k = case.cu_seqlens("cpu")
    q, k, v = case.random_inputs(torch.float16, "cpu")
    k_pages, v_pages, table = page_keys(k, v, cu_k, 16)
    torch.library.opcheck(ops.varlen_attention_forward, (q, k_pages, v_pages, cu_q, cu_k, 5, 33, None, None, 0.25,
                                                         -1, 0, 0.0, 0.0, table))


@pytest.mark.interpreter
def test_unchecked_bad_entries_never_read_outside_the_pools(triton_backend):
    """What the GPU does with indices it cannot check: a page outside the pool reads page 0, a sequence
    longer than its table row is cut at the row's end, an empty pool has no keys. The launcher is called
    directly, past the checks."""
    case = VarlenCase((6, 9), (40, 37), 2, 1, 16)
    cu_q, cu_k = case.cu_seqlens(triton_backend)
    q, k, v = case.random_inputs(torch.float32, triton_backend)
    k_pages, v_pages, table = page_keys(k, v, cu_k, 16, spare_pages=0)
    pools = [x.nan_to_num(0.0) for x in (k_pages, v_pages)]  # page 0 is read: no NaN there
    opts = AttentionOptions.build(16, None, True, (-1, -1), 0.0, 0.0, False)

    def run(pool_k, pool_v, block_table, cu_seqlens_k):
        packing = validation.Packing(cu_q, cu_seqlens_k, 9, 48)
        return launch_forward.launch_forward(q, pool_k, pool_v, None, None, opts, packing=packing,
                                             block_table=block_table)

    # page 1 of sequence 0 (an interior block) and page 2 of sequence 1 (its masked last block)
    bad, zeroed = table.clone(), table.clone()
    bad[0, 1], bad[1, 2] = -(2**30), 2**30
    zeroed[0, 1], zeroed[1, 2] = 0, 0
    for actual, expected in zip(run(*pools, bad, cu_k), run(*pools, zeroed, cu_k), strict=True):
        assert torch.equal(actual, expected)

    # sequence 1 claims 60 keys but its row holds 3 pages (48 keys): it is cut to 48
    three_pages = table[:, :3].contiguous()
    too_long, cut = (torch.tensor(ends, dtype=torch.int32, device=triton_backend)
                     for ends in ([0, 40, 100], [0, 40, 88]))
    for actual, expected in zip(run(*pools, three_pages, too_long), run(*pools, three_pages, cut), strict=True):
        assert torch.equal(actual, expected)

    # an empty pool: every query sees no key
    out, lse = run(*(x[:0] for x in pools), table, cu_k)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all()


# ---------------------------------------------------------------------------------------------
# Bad input: each error names the argument
# ---------------------------------------------------------------------------------------------


def _int32(values):
    return torch.tensor(values, dtype=torch.int32)


def _paged_arguments(page_size=16, **changes):
    """A valid paged call (2 sequences of 20 and 5 keys, 4 pages), updated with ``changes``."""
    args = dict(q=torch.randn(8, 4, 16), k=torch.randn(4, page_size, 2, 16), v=torch.randn(4, page_size, 2, 16),
                cu_seqlens_q=_int32([0, 3, 8]), cu_seqlens_k=_int32([0, 20, 25]), max_seqlen_q=5, max_seqlen_k=20,
                block_table=_int32([[2, 0], [3, 99]]))  # 99: padding past sequence 1's only page
    args.update(changes)
    return args


def _on_backend_device(args: dict, backend: str) -> dict:
    """The kernels' tensors on the GPU where there is one (on CPU they need the interpreter)."""
    device = DEVICE if backend == "triton" else "cpu"
    return {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in args.items()}


BAD_INPUTS = [
    ("dtype", dict(block_table=torch.tensor([[2, 0], [3, 1]])), TypeError, "block_table must be int32"),
    ("rank", dict(block_table=_int32([2, 0, 3, 1])), ValueError, r"block_table must have shape \(2, \*\)"),
    ("batch", dict(block_table=_int32([[2, 0], [3, 1], [1, 1]])), ValueError, r"block_table must have shape \(2, \*\)"),
    ("not-a-tensor", dict(block_table=[[2, 0], [3, 1]]), TypeError, "block_table must be a torch.Tensor"),
    ("page-size", dict(page_size=8), ValueError, "page size k.shape\\[1\\] must be a positive multiple of 16, got 8"),
    ("packed-k", dict(k=torch.randn(25, 2, 16), v=torch.randn(25, 2, 16)), ValueError,
     r"k must have 4 dimensions \(num_pages, page_size, nheads_k, headdim\)"),
    ("v-shape", dict(v=torch.randn(5, 16, 2, 16)), ValueError, "k and v must have the same shape"),
    ("negative-page", dict(block_table=_int32([[2, -1], [3, 1]])), ValueError,
     r"block_table\[0, 1\] = -1 is not a page of k and v: .* \[0, 4\)"),
    ("page-past-pool", dict(block_table=_int32([[2, 0], [4, 1]])), ValueError,
     r"block_table\[1, 0\] = 4 is not a page"),
    ("too-long", dict(cu_seqlens_k=_int32([0, 20, 53]), max_seqlen_k=torch.tensor(33)), ValueError,
     r"cu_seqlens_k gives sequence 1 33 keys, more than block_table can hold: .* = 32"),
    ("max-k-past-capacity", dict(max_seqlen_k=33), ValueError,
     r"max_seqlen_k must be at most the keys a block_table row can hold, .* = 32, got 33"),
    ("max-k-small", dict(max_seqlen_k=19), ValueError, "max_seqlen_k must be at least the longest"),
    ("cu-seqlens-k-decreasing", dict(cu_seqlens_k=_int32([0, 20, 19])), ValueError,
     "cu_seqlens_k must be non-decreasing"),
]

# index values checked only where they are on the host anyway (CPU tensors, or the torch path)
READ_ON_HOST_ONLY = {"negative-page", "page-past-pool", "max-k-small", "cu-seqlens-k-decreasing"}


@pytest.mark.parametrize("name,changes,error,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_error(backend, name, changes, error, message):
    if backend == "triton" and DEVICE == "cuda" and name in READ_ON_HOST_ONLY:
        pytest.skip("the GPU kernels' launcher does not read index values (that would synchronize): "
                    "test_unchecked_bad_entries_never_read_outside_the_pools covers what they do")
    with pytest.raises(error, match=message):
        flash_attn_varlen_func(**_on_backend_device(_paged_arguments(**changes), backend))


def test_good_arguments_of_the_bad_input_table_run(backend):
    # the table's base call is valid: its padding entry (99) is never read
    out = flash_attn_varlen_func(**_on_backend_device(_paged_arguments(), backend))
    assert out.shape == (8, 4, 16) and torch.isfinite(out).all()


@pytest.mark.gpu
def test_block_table_on_another_device_is_refused():
    args = {name: x.cuda() if isinstance(x, torch.Tensor) else x for name, x in _paged_arguments().items()}
    args["block_table"] = args["block_table"].cpu()
    with pytest.raises(ValueError, match="block_table must be on q's device"):
        flash_attn_varlen_func(**args)


def _paged_call(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table):
    return flash_attn_varlen_func(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  causal=True, block_table=block_table)


def test_fullgraph_compile_matches_eager(torch_backend):
    """A prefill step over a paged cache compiles without graph breaks (the op's fake carries it)."""
    torch._dynamo.reset()
    compiled = torch.compile(_paged_call, fullgraph=True, dynamic=True, backend=COMPILE_BACKEND)
    for seqlens_q, seqlens_k in (((5, 1), (40, 17)), ((3, 9), (9, 60))):
        case = VarlenCase(seqlens_q, seqlens_k, 4, 2, 32)
        cu_q, cu_k = case.cu_seqlens("cpu")
        q, k, v = case.random_inputs(torch.float32, "cpu")
        k_pages, v_pages, table = page_keys(k, v, cu_k, 16)
        arguments = (q, k_pages, v_pages, cu_q, cu_k, cu_q.diff().max(), cu_k.diff().max(), table)
        assert torch.equal(compiled(*arguments), _paged_call(*arguments))


def test_fullgraph_compile_with_queries_that_need_grad(torch_backend):
    """A forward whose q needs grad compiles (the refusal is an op of the backward graph, run only by a backward),
    and the backward raises as in eager."""
    torch._dynamo.reset()
    case = VarlenCase((3, 4), (20, 1), 2, 1, 16)
    cu_q, cu_k = case.cu_seqlens("cpu")
    q, k, v = case.random_inputs(torch.float32, "cpu")
    k_pages, v_pages, table = page_keys(k, v, cu_k, 16)
    arguments = (q.requires_grad_(), k_pages, v_pages, cu_q, cu_k, 4, 20, table)
    out = torch.compile(_paged_call, fullgraph=True, backend=COMPILE_BACKEND)(*arguments)
    assert torch.equal(out, _paged_call(*arguments))
    with pytest.raises(RuntimeError, match="block_table .* is forward only"):
        out.sum().backward()
