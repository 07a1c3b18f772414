"""flashattn.scaled_dot_product_attention against torch's, which in float64 is the oracle.

The baseline that sets the tolerance is plain PyTorch in the input precision (``attention_ref`` with
``upcast=False`` and the same mask). Each test runs on the CPU path and, where marked, on the Triton
kernels (the interpreter without a GPU); the ``gpu`` grid adds large shapes.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from cases import covering

from flashattn import scaled_dot_product_attention
from flashattn.launch import common
from flashattn.launch import forward as launch_forward
from flashattn.options import new_rng_state
from flashattn.reference import attention_ref
from flashattn.testing import assert_within_rule, score_grad_floor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def causal_and(attn_mask: torch.Tensor | None, seqlen_q: int, seqlen_k: int, device) -> torch.Tensor:
    """torch's is_causal (top-left) combined with ``attn_mask``, spelled out as one explicit mask."""
    causal = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).tril()
    if attn_mask is None:
        return causal
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal
    return attn_mask.masked_fill(~causal, float("-inf"))


def make_mask(kind: str, batch: int, nheads: int, seqlen_q: int, seqlen_k: int, dtype, device):
    """Masks of every broadcast shape; each leaves every row at least one key (see the empty-row tests)."""
    if kind == "none":
        return None
    shapes = {
        "bool-2d": (seqlen_q, seqlen_k), "bool-batch": (batch, 1, seqlen_q, seqlen_k),
        "bool-padding": (batch, 1, 1, seqlen_k), "float-heads": (1, nheads, seqlen_q, seqlen_k),
        "float-full": (batch, nheads, seqlen_q, seqlen_k), "float-2d-grad": (seqlen_q, seqlen_k),
        "float32-full-grad": (batch, nheads, seqlen_q, seqlen_k), "float-keys-grad": (1, nheads, 1, seqlen_k),
    }
    shape = shapes[kind]
    if kind.startswith("bool"):
        mask = torch.rand(shape, device=device) > 0.3
        mask[..., 0] = True  # key 0: every row keeps a key, also under is_causal
        return mask
    mask_dtype = torch.float32 if kind.startswith("float32") else dtype
    mask = torch.randn(shape, device=device, dtype=mask_dtype)
    mask = mask.masked_fill(torch.rand(shape, device=device) < 0.2, float("-inf"))
    mask[..., 0] = 0.0
    return mask.requires_grad_(kind.endswith("grad"))


def check_sdpa(query, key, value, attn_mask=None, *, is_causal=False, scale=None, enable_gqa=False,
               backward=True, dout=None):
    """flashattn's SDPA within the tolerance rule of torch's in float64, outputs and gradients (for ``dout``, by
    default a random one); with ``backward``, returns what it checked: (out, dq, dk, dv)."""
    mask_grad = attn_mask is not None and attn_mask.requires_grad
    leaves = [x.detach().requires_grad_(backward) for x in (query, key, value)]
    mask = attn_mask.detach().requires_grad_(backward) if mask_grad else attn_mask
    out = scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=is_causal, scale=scale,
                                       enable_gqa=enable_gqa)

    oracle_leaves = [x.detach().double().requires_grad_(backward) for x in leaves]
    oracle_mask = mask
    if mask is not None and mask.dtype != torch.bool:
        oracle_mask = mask.detach().double().requires_grad_(mask_grad and backward)
    if is_causal and mask is not None:  # torch refuses both: spell the causal part out
        explicit = causal_and(oracle_mask, query.shape[-2], key.shape[-2], query.device)
        oracle = F.scaled_dot_product_attention(*oracle_leaves, attn_mask=explicit, scale=scale,
                                                enable_gqa=enable_gqa)
    else:
        oracle = F.scaled_dot_product_attention(*oracle_leaves, attn_mask=oracle_mask, is_causal=is_causal,
                                                scale=scale, enable_gqa=enable_gqa)

    # plain PyTorch in the input precision: the materializing reference on (B, L, H, E) views
    baseline_leaves = [x.detach().clone().requires_grad_(backward) for x in leaves]
    baseline_mask = mask.detach().clone().requires_grad_(mask_grad and backward) if mask_grad else mask
    explicit = causal_and(baseline_mask, query.shape[-2], key.shape[-2], query.device) if is_causal \
        else baseline_mask
    unbatched = query.dim() == 3
    as_blhe = [(x.unsqueeze(0) if unbatched else x).transpose(1, 2) for x in baseline_leaves]
    baseline, _ = attention_ref(*as_blhe, softmax_scale=scale, attn_mask=explicit, upcast=False)
    baseline = baseline.transpose(1, 2)
    baseline = baseline.squeeze(0) if unbatched else baseline

    assert out.shape == oracle.shape and out.dtype == query.dtype
    assert_within_rule("out", out, oracle, baseline, factor=2)
    if not backward:
        return
    dout = torch.randn_like(out) if dout is None else dout
    inputs = leaves + ([mask] if mask_grad else [])
    grads = torch.autograd.grad(out, inputs, dout)
    oracle_grads = torch.autograd.grad(oracle, oracle_leaves + ([oracle_mask] if mask_grad else []),
                                       dout.double())
    baseline_grads = torch.autograd.grad(baseline, baseline_leaves + ([baseline_mask] if mask_grad else []), dout)
    head_dim = query.shape[-1]
    score_floor = score_grad_floor(dout, out, oracle, value)
    qk_floor = score_floor * max(query.abs().max().item(), key.abs().max().item()) * (scale or head_dim**-0.5)
    for name, grad, oracle_grad, baseline_grad in zip(("dq", "dk", "dv"), grads[:3], oracle_grads[:3],
                                                      baseline_grads[:3], strict=True):
        assert grad.dtype == query.dtype
        assert_within_rule(name, grad, oracle_grad, baseline_grad, factor=3, floor=qk_floor)
    if mask_grad:
        assert grads[3].dtype == mask.dtype and grads[3].shape == mask.shape
        summed = out.numel() // out.shape[-1] * key.shape[-2] // mask.numel()  # scores per mask entry
        assert_within_rule("dmask", grads[3], oracle_grads[3], baseline_grads[3], factor=3,
                           floor=score_floor * summed)
    return (out, *grads[:3])


def sdpa_inputs(batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim, dtype, device=DEVICE):
    query = torch.randn(batch, nheads, seqlen_q, head_dim, dtype=dtype, device=device)
    key = torch.randn(batch, nheads_k, seqlen_k, head_dim, dtype=dtype, device=device)
    value = torch.randn(batch, nheads_k, seqlen_k, head_dim, dtype=dtype, device=device)
    return query, key, value


# (batch, heads, heads_k, Lq, Lk, E): Lq < Lk, Lq > Lk (GQA), square, single token
CPU_SHAPES = [(2, 4, 4, 37, 53, 40), (1, 6, 2, 53, 37, 96), (2, 2, 1, 70, 70, 64), (2, 2, 2, 1, 1, 16)]
CPU_MASKS = ["none", "bool-2d", "bool-batch", "bool-padding", "float-heads", "float-full", "float-2d-grad",
             "float32-full-grad", "float-keys-grad"]


# Pairwise (cases.covering): each mask on every shape, with and without is_causal, in every dtype
@pytest.mark.parametrize("mask_kind,shape,is_causal,dtype", covering(CPU_MASKS, CPU_SHAPES, [False, True], DTYPES),
                         ids=str)
def test_cpu_path_matches_torch(torch_backend, shape, mask_kind, is_causal, dtype):
    batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim = shape
    inputs = sdpa_inputs(*shape, dtype, torch_backend)
    mask = make_mask(mask_kind, batch, nheads, seqlen_q, seqlen_k, dtype, torch_backend)
    check_sdpa(*inputs, mask, is_causal=is_causal, enable_gqa=nheads != nheads_k)


INTERPRETER_SHAPES = [(1, 2, 1, 21, 37, 40), (2, 2, 2, 37, 21, 24)]
INTERPRETER_MASKS = ["none", "bool-batch", "bool-padding", "float-heads", "float-2d-grad", "float32-full-grad"]


# Pairwise (cases.covering): each mask on both shapes with and without is_causal, the dtypes taking turns
@pytest.mark.interpreter
@pytest.mark.parametrize("shape,mask_kind,is_causal,dtype", [
    (shape, mask_kind, is_causal, dtype) for mask_kind, (shape, is_causal), dtype in covering(
        INTERPRETER_MASKS, list(itertools.product(INTERPRETER_SHAPES, [False, True])), [torch.float32, torch.float16])],
    ids=str)
def test_kernels_match_torch(triton_backend, shape, mask_kind, is_causal, dtype):
    batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim = shape
    inputs = sdpa_inputs(*shape, dtype, triton_backend)
    mask = make_mask(mask_kind, batch, nheads, seqlen_q, seqlen_k, dtype, triton_backend)
    check_sdpa(*inputs, mask, is_causal=is_causal, enable_gqa=nheads != nheads_k)


@pytest.mark.interpreter
def test_kernels_bf16_with_mask(triton_backend):
    inputs = sdpa_inputs(1, 2, 2, 19, 33, 32, torch.bfloat16, triton_backend)
    mask = make_mask("float-2d-grad", 1, 2, 19, 33, torch.bfloat16, triton_backend)
    check_sdpa(*inputs, mask, is_causal=True)


GPU_SHAPES = [(2, 8, 2, 1023, 1024, 128), (1, 4, 4, 257, 2049, 64), (2, 4, 1, 2048, 511, 256),
              (4, 4, 4, 113, 113, 40), (1, 2, 2, 4096, 4096, 96)]
GPU_MASKS = ["none", "bool-2d", "bool-padding", "float-heads", "float-2d-grad", "float32-full-grad"]


@pytest.mark.gpu
@pytest.mark.parametrize("mask_kind,shape,is_causal,dtype", covering(GPU_MASKS, GPU_SHAPES, [False, True], DTYPES),
                         ids=str)
def test_kernels_match_torch_large(triton_backend, shape, mask_kind, is_causal, dtype):
    batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim = shape
    inputs = sdpa_inputs(*shape, dtype, "cuda")
    mask = make_mask(mask_kind, batch, nheads, seqlen_q, seqlen_k, dtype, "cuda")
    check_sdpa(*inputs, mask, is_causal=is_causal, enable_gqa=nheads != nheads_k)
    torch.cuda.synchronize()


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(0, 5), (4, 0), (0, 0)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_sequences_give_what_torch_gives(torch_backend, seqlen_q, seqlen_k, is_causal):
    """No queries: an empty output; no keys: zeros (torch 2.5+), and zero gradients either way."""
    query, key, value = (x.requires_grad_() for x in sdpa_inputs(2, 4, 2, seqlen_q, seqlen_k, 16, torch.float32))
    out = scaled_dot_product_attention(query, key, value, is_causal=is_causal, enable_gqa=True)
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=is_causal, enable_gqa=True)
    assert torch.equal(out, expected)
    grads = torch.autograd.grad(out.sum(), (query, key, value))
    assert all(torch.equal(g, torch.zeros_like(x)) for g, x in zip(grads, (query, key, value), strict=True))


def test_scale_gqa_unbatched_and_mask_with_causal(backend):
    # an explicit scale; 3-dim inputs (heads, L, E); a kv head shared by all query heads without
    # enable_gqa (torch broadcasts it); and a float mask with is_causal (torch refuses the pair)
    check_sdpa(*sdpa_inputs(2, 4, 4, 29, 41, 32, torch.float32), scale=0.3, is_causal=True)
    query, key, value = (x[0] for x in sdpa_inputs(1, 4, 2, 29, 17, 32, torch.float32))
    check_sdpa(query, key, value, make_mask("float-2d-grad", 1, 4, 29, 17, torch.float32, DEVICE)[None],
               enable_gqa=True)
    check_sdpa(*sdpa_inputs(1, 3, 1, 23, 23, 16, torch.float32), is_causal=True)


@pytest.mark.interpreter
def test_transposed_views_are_not_copied(monkeypatch):
    """(B, H, L, E) inputs reach the kernels as (B, L, H, E) views of the same storage."""
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    seen = {}
    launch = launch_forward.launch_forward

    def spy(q, k, v, *args, **kwargs):
        seen.update(q=q, k=k, v=v, reused=[common.last_dim_contiguous(x) is x for x in (q, k, v)])
        return launch(q, k, v, *args, **kwargs)

    monkeypatch.setattr(launch_forward, "launch_forward", spy)
    query, key, value = sdpa_inputs(1, 2, 2, 17, 17, 16, torch.float32)
    scaled_dot_product_attention(query, key, value)
    assert seen["q"].data_ptr() == query.data_ptr() and seen["k"].data_ptr() == key.data_ptr()
    assert seen["q"].shape == (1, 17, 2, 16) and seen["reused"] == [True, True, True]


# -- rows that see no key: out = 0 and zero gradients, as torch 2.5+ gives --


@pytest.mark.parametrize("kind", ["bool", "float-inf"])
def test_rows_with_every_key_masked_give_zero(backend, kind):
    query, key, value = (x.requires_grad_() for x in sdpa_inputs(2, 2, 2, 20, 33, 16, torch.float32))
    hidden = torch.zeros(20, dtype=torch.bool, device=DEVICE)
    hidden[[0, 7, 19]] = True
    keep = (torch.rand(2, 1, 20, 33, device=DEVICE) > 0.4) & ~hidden[:, None]
    keep[..., ~hidden, 0] = True
    mask = keep if kind == "bool" else torch.zeros(keep.shape, device=DEVICE).masked_fill(~keep, float("-inf"))
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask)
    assert torch.equal(out[:, :, hidden], torch.zeros_like(out[:, :, hidden]))
    expected = F.scaled_dot_product_attention(query.double(), key.double(), value.double(),
                                              attn_mask=mask if kind == "bool" else mask.double())
    assert torch.equal(expected[:, :, hidden], torch.zeros_like(expected[:, :, hidden]))
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (query, key, value))
    assert torch.equal(query.grad[:, :, hidden], torch.zeros_like(query.grad[:, :, hidden]))
    check_sdpa(query, key, value, mask)


def test_float_mask_gradient_is_zero_where_the_mask_is_minus_inf(backend):
    query, key, value = sdpa_inputs(1, 2, 2, 9, 12, 16, torch.float32)
    mask = torch.randn(1, 2, 9, 12, device=DEVICE).masked_fill(torch.rand(1, 2, 9, 12, device=DEVICE) < 0.3,
                                                                  float("-inf"))
    mask[..., 0, :] = float("-inf")
    mask.requires_grad_()
    scaled_dot_product_attention(query, key, value, attn_mask=mask).sum().backward()
    assert torch.isfinite(mask.grad).all()
    assert torch.equal(mask.grad[torch.isinf(mask)], torch.zeros_like(mask.grad[torch.isinf(mask)]))


# -- dropout: the same stream as flashattn's own reference --


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal-long-q"])
def test_dropout_replays_the_reference(backend, is_causal):
    query, key, value = sdpa_inputs(2, 2, 2, 37, 21, 16, torch.float32)
    mask = make_mask("bool-batch", 2, 2, 37, 21, torch.float32, DEVICE)
    torch.manual_seed(0)
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.3, is_causal=is_causal)
    torch.manual_seed(0)
    rng_state = new_rng_state()
    # top-left causal with Lq > Lk is flashattn's window (-1, Lq - Lk)
    window = (-1, 37 - 21) if is_causal else (-1, -1)
    blhe = [x.transpose(1, 2) for x in (query, key, value)]
    oracle, _ = attention_ref(*blhe, attn_mask=mask, window_size=window, dropout_p=0.3, rng_state=rng_state)
    baseline, _ = attention_ref(*blhe, attn_mask=mask, window_size=window, dropout_p=0.3, rng_state=rng_state,
                                upcast=False)
    assert_within_rule("out", out, oracle.transpose(1, 2), baseline.transpose(1, 2), factor=2)
    dropped = (out == 0).all(-1).float().mean().item()
    assert dropped < 0.5


def test_dropout_mean_approaches_no_dropout(torch_backend):
    query, key, value = sdpa_inputs(1, 1, 1, 24, 24, 16, torch.float32)
    expected = scaled_dot_product_attention(query, key, value, is_causal=True)
    draws = 300
    mean = sum(scaled_dot_product_attention(query, key, value, dropout_p=0.25, is_causal=True)
               for _ in range(draws)) / draws
    single = (scaled_dot_product_attention(query, key, value, dropout_p=0.25, is_causal=True)
              - expected).abs().mean().item()
    assert (mean - expected).abs().mean().item() < 2.5 * single / draws**0.5


# -- bad input --

BAD_INPUTS = [
    ("rank", lambda q, k, v: (q[0, 0], k, v), {}, ValueError, "query must have 4 dimensions"),
    ("rank-mismatch", lambda q, k, v: (q, k[0], v[0]), {}, ValueError, "key must have query's rank"),
    ("dtype", lambda q, k, v: (q.double(), k.double(), v.double()), {}, TypeError, "float16, bfloat16"),
    ("dtype-mismatch", lambda q, k, v: (q, k.half(), v.half()), {}, TypeError, "key must have query's dtype"),
    ("value-head-dim", lambda q, k, v: (q, k, v[..., :8]), {}, ValueError, "value must have query's head dim"),
    ("kv-shape", lambda q, k, v: (q, k, v[:, :, :5]), {}, ValueError, "key and value must agree"),
    ("batch", lambda q, k, v: (q, k[:1], v[:1]), {}, ValueError, "batch size"),
    ("gqa-flag", lambda q, k, v: (q, k, v), {}, ValueError, "enable_gqa=True"),
    ("gqa-multiple", lambda q, k, v: (q[:, :3], k, v), {"enable_gqa": True}, ValueError, "multiple of"),
    ("dropout", lambda q, k, v: (q, k, v), {"dropout_p": 1.0, "enable_gqa": True}, ValueError, "dropout_p"),
    ("dropout-type", lambda q, k, v: (q, k, v), {"dropout_p": "x", "enable_gqa": True}, TypeError, "dropout_p"),
    ("no-heads", lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0]), {}, ValueError, "at least one head"),
    ("no-kv-heads", lambda q, k, v: (q, k[:, :0], v[:, :0]), {"enable_gqa": True}, ValueError, "at least one head"),
    ("mask-type", lambda q, k, v: (q, k, v), {"attn_mask": [[True]], "enable_gqa": True}, TypeError,
     "attn_mask must be a torch.Tensor"),
    ("mask-dtype", lambda q, k, v: (q, k, v), {"attn_mask": torch.zeros(8, 8, dtype=torch.int64),
                                               "enable_gqa": True}, TypeError, "attn_mask must be bool"),
    ("mask-shape", lambda q, k, v: (q, k, v), {"attn_mask": torch.zeros(8, 9, dtype=torch.bool),
                                               "enable_gqa": True}, ValueError, "broadcastable"),
    ("mask-rank", lambda q, k, v: (q, k, v), {"attn_mask": torch.zeros(1, 1, 1, 8, 8, dtype=torch.bool),
                                              "enable_gqa": True}, ValueError, "broadcastable"),
    ("not-a-tensor", lambda q, k, v: (q.tolist(), k, v), {}, TypeError, "query must be a torch.Tensor"),
    ("head-dim", lambda q, k, v: ((torch.randn(2, 4, 8, 300),) * 3), {}, ValueError, "between 1 and 256"),
]


@pytest.mark.parametrize("name,transform,options,error,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_error(name, transform, options, error, message):
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(*transform(q, k, v), **options)
