"""The trainable FP8 attention, ``fp8.flash_attn_func``: its gradients against the float64 attention of the values
the FP8 forward computes with, within the FP8 backward's error model (``testing.fp8_gradient_bound``).

The model predicts each gradient row's RMS error from e4m3's unit roundoff (2^-4) applied once to every element of
dO, P and dS. A row (one query's dq, one key's dk or dv, over the head dim) sums many independent roundings, so its
error norm stays under ROW_SIGMAS times the predicted RMS except in a far tail; over a whole tensor the sum of
squares concentrates, so the tensor's error norm must be within TENSOR_FACTOR of the predicted one. Both also allow
the error the model takes as given (delta's use of the forward's rounded output) and twice the rounding of the
reference to the gradients' dtype.
"""

import pytest
import torch
from cases import assert_unchanged_by_nan, second_sequence_nan

from flashattn import configs, flash_attn_func, fp8, fp8_backward, ops_fp8
from flashattn.launch.forward import l2_section_units
from flashattn.options import AttentionOptions
from flashattn.reference import attention_ref
from flashattn.testing import fp8_gradient_bound

ROW_SIGMAS = 5.0
TENSOR_FACTOR = 1.5


def make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype=torch.bfloat16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = ((batch, seqlen_q, nheads, head_dim), (batch, seqlen_k, nheads_k, head_dim),
              (batch, seqlen_k, nheads_k, head_dim), (batch, seqlen_q, nheads, head_dim))
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


def fp8_gradients(q, k, v, dout, **options):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fp8.flash_attn_func(q, k, v, **options)
    return out, torch.autograd.grad(out, (q, k, v), dout)


def reference(q, k, v, dout, seed, hadamard=True, granularity="block", **options):
    """The float64 values the FP8 forward computes with (q and k rotated back to their own basis) and their output and
    gradients: ((q, k rotated, v), out, (dq, dk, dv))."""
    quantized = fp8.quantize(q, k, v, hadamard=hadamard, seed=seed, granularity=granularity)
    rotated = [fp8.dequantize(x, d, torch.float64) for x, d in zip(quantized[:3], quantized[3:], strict=True)]
    back = torch.eye(q.shape[-1], dtype=torch.float64, device=q.device)
    if hadamard:
        back = fp8.rotation_matrix(fp8.random_signs(q.shape[-1], seed, q.device), torch.float64).T
    leaves = [(rotated[0] @ back).requires_grad_(), (rotated[1] @ back).requires_grad_(), rotated[2].requires_grad_()]
    out, _ = attention_ref(*leaves, upcast=True, **options)
    return rotated, out, torch.autograd.grad(out, leaves, dout.double())


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) -> the norms over the head dim, (B, H, S): the bound's rows."""
    return x.norm(dim=-1).transpose(1, 2)


def check_gradients(q, k, v, dout, seed=0, hadamard=True, granularity="block", **options):
    out, grads = fp8_gradients(q, k, v, dout, seed=seed, hadamard=hadamard, granularity=granularity, **options)
    rotated, _, oracle = reference(q, k, v, dout, seed, hadamard, granularity, **options)
    scale = options.get("softmax_scale") or q.shape[-1] ** -0.5
    bound = fp8_gradient_bound(*rotated, dout, out, scale, options.get("causal", False),
                               options.get("window_size", (-1, -1)), options.get("softcap", 0.0))
    for name, grad, want in zip(("dq", "dk", "dv"), grads, oracle, strict=True):
        assert grad.dtype == q.dtype and grad.shape == want.shape
        error = row_norms(grad.double() - want)
        rounding = row_norms(want.to(grad.dtype).double() - want)
        rms, offset = bound.rms[name], bound.offset[name]
        row_bound = ROW_SIGMAS * rms + offset + 2 * rounding
        worst = int((error - row_bound).argmax())
        assert (error <= row_bound).all(), (
            f"{name}: row {tuple(torch.unravel_index(torch.tensor(worst), error.shape))} error "
            f"{error.flatten()[worst]:.3e} > {ROW_SIGMAS} x predicted RMS {rms.flatten()[worst]:.3e} + offset "
            f"{offset.flatten()[worst]:.3e} + 2 x rounding {rounding.flatten()[worst]:.3e}")
        total, predicted = error.norm().item(), rms.norm().item()
        allowed = TENSOR_FACTOR * predicted + offset.norm().item() + 2 * rounding.norm().item()
        assert total <= allowed, f"{name}: error norm {total:.3e} > {TENSOR_FACTOR} x predicted {predicted:.3e} + ..."
    return grads


@pytest.mark.parametrize("shape,options", [
    ((1, 113, 113, 2, 2, 128), {}),
    ((2, 1, 77, 4, 2, 40), {}),  # one query, GQA
    ((1, 113, 200, 4, 2, 96), {"causal": True}),  # seqlen_q != seqlen_k, two key blocks, head dim 64 + 32
    ((1, 77, 1, 2, 1, 64), {"causal": True}),  # one key (MQA): dS is about 0
    ((1, 150, 150, 2, 2, 64), {"window_size": (20, 5), "softcap": 4.0}),
], ids=str)
def test_gradients_within_the_fp8_error_model(torch_backend, shape, options):
    check_gradients(*make_inputs(*shape), seed=3, **options)


@pytest.mark.parametrize("hadamard,granularity", [(False, "head"), (True, "head")])
def test_gradients_without_rotation_or_with_per_head_descales(torch_backend, hadamard, granularity):
    check_gradients(*make_inputs(1, 130, 130, 2, 2, 64), seed=1, hadamard=hadamard, granularity=granularity,
                    causal=True)


def test_gradients_a_row_slab_at_a_time(torch_backend, monkeypatch):
    """Long sequences take each key block's queries a slab at a time (``fp8_backward.ROW_SLAB``): slabs of one and
    two dS tiles, causal with seqlen_q != seqlen_k, hold the same bound."""
    for slab in (64, 128):
        monkeypatch.setattr(fp8_backward, "ROW_SLAB", slab)
        check_gradients(*make_inputs(1, 300, 200, 2, 1, 64), seed=4, causal=True)


def test_gradients_are_in_the_inputs_basis(torch_backend):
    """dq and dk come back in q's and k's basis: near the reference there, far from it in the rotated basis."""
    q, k, v, dout = make_inputs(1, 64, 64, 2, 2, 64)
    _, (dq, dk, _) = fp8_gradients(q, k, v, dout, seed=5)
    _, _, (want_q, want_k, _) = reference(q, k, v, dout, 5)
    rotation = fp8.rotation_matrix(fp8.random_signs(64, 5, q.device), torch.float64)
    for grad, want in ((dq, want_q), (dk, want_k)):
        relative = ((grad.double() - want).norm() / want.norm()).item()
        rotated = ((grad.double() - want @ rotation).norm() / want.norm()).item()
        assert relative < 0.15 < 1.0 < rotated, (relative, rotated)


def test_dtype_views_and_inputs(torch_backend):
    """float16 stays float16 (out and gradients, contiguous as the backward op's fake says); a strided view gives a
    contiguous copy's results bit for bit; the inputs are left as they were; the lse is the FP8 forward's on
    fp8.quantize's tensors."""
    q, k, v, dout = make_inputs(2, 40, 56, 4, 2, 64, dtype=torch.float16)
    wide = torch.randn(2, 40, 4, 128, dtype=torch.float16)
    q_view = wide[..., ::2]
    q_view.copy_(q)
    before = [x.clone() for x in (q_view, k, v)]
    out, grads = fp8_gradients(q_view, k, v, dout, seed=2, causal=True)
    assert out.dtype == torch.float16 and all(g.dtype == torch.float16 and g.is_contiguous() for g in grads)
    out_copy, grads_copy = fp8_gradients(q_view.contiguous(), k, v, dout, seed=2, causal=True)
    assert torch.equal(out, out_copy) and all(torch.equal(a, b) for a, b in zip(grads, grads_copy, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before, (q_view, k, v), strict=True))
    _, lse, _ = fp8.flash_attn_func(q, k, v, seed=2, causal=True, return_attn_probs=True)
    x = fp8.quantize(q, k, v, seed=2)
    _, want_lse, _ = flash_attn_func(x.q, x.k, x.v, q_descale=x.q_descale, k_descale=x.k_descale,
                                     v_descale=x.v_descale, causal=True, return_attn_probs=True)
    assert torch.equal(lse, want_lse)


def test_ds_tiles_round_by_their_amax_and_denormal_ones_to_zero():
    """dS's e4m3 rounding: within half an e4m3 step of each value (relative 2^-4, or the subnormal step 2^-9 of the
    tile's descale); a tile whose amax / 448 is below float32's range (P about e^-100 in trained attention) rounds to
    zeros, not 0 / 0."""
    x = torch.randn(3, 64, 128, generator=torch.Generator().manual_seed(0)) * torch.tensor([1.0, 1e-30, 1e-3])[:, None,
                                                                                                                None]
    descale = x.abs().amax(dim=(-2, -1), keepdim=True) / 448
    assert ((fp8_backward.rounded_tile(x) - x).abs() <= x.abs() / 16 + descale / 2**9).all()
    tiny = torch.tensor([[[1e-44, -2e-43, 0.0]]])  # amax / 448 rounds to 0 in float32
    assert torch.equal(fp8_backward.rounded_tile(tiny), torch.zeros_like(tiny))


@pytest.mark.parametrize("change,message", [
    ({x: torch.zeros(1, 8, 2, 32) for x in "qkv"}, "q must be bfloat16 or float16"),
    ({"k": torch.zeros(1, 8, 2, 32, dtype=torch.float16)}, "k must have q's dtype"),
    ({"q": torch.zeros(8, 2, 32, dtype=torch.bfloat16)}, "q must have 4 dimensions"),
    ({"dropout_p": 0.1}, "dropout_p is not supported"),
    ({"alibi_slopes": torch.ones(2)}, "alibi_slopes is not supported"),
    ({"granularity": "row"}, "granularity must be 'block' or 'head'"),
    ({"hadamard": 1}, "hadamard must be a bool"),
    ({"seed": 1.5}, "seed must be an int or None"),
    ({"window_size": (3,)}, "window_size must be a pair"),
], ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_bad_input_names_the_argument(change, message):
    arguments = dict(zip("qkv", make_inputs(1, 8, 8, 2, 2, 32)[:3], strict=True))
    arguments.update(change)
    with pytest.raises((TypeError, ValueError), match=message):
        fp8.flash_attn_func(**arguments)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,options", [((2, 300, 300, 8, 4, 128), {"causal": True}), ((1, 257, 513, 4, 4, 64), {})],
                         ids=str)
def test_gradients_within_the_fp8_error_model_gpu(shape, options):
    """The GPU's FP8 forward (the kernel, P rounded to e4m3) under the same backward and bound."""
    check_gradients(*(x.cuda() for x in make_inputs(*shape)), seed=3, **options)


@pytest.mark.parametrize("name,tokens,width,pairs", [("transposed_queries", 113, 128, False),
                                                     ("transposed_keys", 130, 256, False),
                                                     ("transposed_keys", 130, 256, True)])
def test_transposed_copies_pad_to_blocks_in_operand_order(triton_backend, name, tokens, width, pairs):
    """Q^T and dO^T for the Gluon dK/dV kernel, K^T for the dQ kernel: (B, S, H, D) -> (B, H, D, S rounded up to a
    64-query or 128-key block), zeros past S, position p of each 32 holding token 16 p4 + 8 p1 + 4 p3 + 2 p2 + p0
    (the register operand's order of P^T and dS^T, or of dS); the fused kernel's K^T (``pairs``), position p of each
    16 holding key 8 p0 + (p >> 1 & 7) (its dS byte pairs)."""
    from flashattn.launch import backward_fp8

    x = torch.randn(2, tokens, 3, 64, device=triton_backend).to(torch.float8_e4m3fn)
    xt = getattr(backward_fp8, name)(x, **({"pairs": True} if pairs else {})).view(torch.uint8)
    assert xt.shape == (2, 3, 64, width) and xt.is_contiguous()
    bits = [(torch.arange(width) >> i) & 1 for i in range(5)]
    if pairs:
        order = torch.arange(width) // 16 * 16 + 8 * bits[0] + (torch.arange(width) >> 1 & 7)
    else:
        order = torch.arange(width) // 32 * 32 + 16 * bits[4] + 8 * bits[1] + 4 * bits[3] + 2 * bits[2] + bits[0]
    padded = torch.cat([x.cpu().view(torch.uint8), torch.zeros(2, width - tokens, 3, 64, dtype=torch.uint8)], 1)
    assert torch.equal(xt.cpu(), padded[:, order].permute(0, 2, 3, 1))


@pytest.mark.interpreter
def test_passes_around_the_kernels_copy_pack_and_rotate_back(triton_backend):
    """``kernels/backward_fp8_passes.py``, checked on one call each:

    - ``float16_copies`` (a conversion on the bits): every e4m3 value but NaN, subnormals and both zeros included,
      equal to PyTorch's conversion, in a tensor whose length is not a multiple of the kernel's block;
    - ``_descales``: q's, k's, v's and dO's descales as four contiguous (batch, nheads_k, blocks) tensors, block
      descales of a shorter sequence padded with ones, a per-head descale repeated over every block;
    - ``rotated_back``: float32 dQ / dK times M^T, M the quantizer's rotation diag(signs) H (block-diagonal at head
      dim 96: 64 + 32, zero-padded to 128), rounded once to bfloat16, against the float64 product rounded the same
      way: within one bfloat16 step of it (the interpreter's conversion truncates) plus what float32 sums of the
      terms may lose, 2^-19 of the sum of their magnitudes (an entry whose terms cancel is small against them).
      Without a rotation the pass is the rounding alone. The quantizer's S, built by its kernel, is diag(signs) H."""
    from flashattn.configs import padded_head_dim
    from flashattn.fp8_format import hadamard_pieces, rotation_matrix, sylvester_hadamard
    from flashattn.launch.backward_fp8 import _descales, float16_copies, rotated_back
    from flashattn.launch.quantize_fp8 import rotation_operands

    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    x = codes.repeat(24).view(torch.float8_e4m3fn).reshape(2, 127, 3, 8)
    (y,) = float16_copies(x.to(triton_backend))
    assert y.dtype == torch.float16 and y.shape == x.shape
    assert torch.equal(y.cpu().view(torch.int16), x.to(torch.float16).view(torch.int16))

    q_d, k_d = torch.rand(2, 3, 2) + 0.5, torch.rand(2, 3, 5) + 0.5
    v_d, do_d = torch.rand(2, 3) + 0.5, torch.rand(3, 2, 5).transpose(0, 1) + 0.5  # per head; a strided view
    got = _descales(tuple(d.to(triton_backend) for d in (q_d, k_d, v_d)), do_d.to(triton_backend), 5)
    want = (torch.cat([q_d, torch.ones(2, 3, 3)], 2), k_d, v_d[:, :, None].expand(2, 3, 5), do_d)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (2, 3, 5) and g.is_contiguous() and torch.equal(g.cpu(), w)

    head_dim, width = 96, padded_head_dim(96)
    signs = fp8.random_signs(head_dim, 7, torch.device(triton_backend))
    rotation = rotation_operands(signs, hadamard_pieces(head_dim), torch.bfloat16, width)
    want_s = torch.zeros(width, width)
    want_s[:head_dim, :head_dim] = signs.cpu()[:, None] * torch.block_diag(
        *(sylvester_hadamard(n, torch.device("cpu")) for n in hadamard_pieces(head_dim)))
    assert torch.equal(rotation[0].cpu().float(), want_s)
    grad = torch.randn(2, 37, 3, head_dim) * torch.logspace(-20, 20, head_dim)  # columns of very different sizes
    got = rotated_back(grad.to(triton_backend), rotation, torch.bfloat16).cpu()
    back = rotation_matrix(signs.cpu(), torch.float64).T
    want = (grad.double() @ back).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == grad.shape
    step = 2.0 ** (torch.frexp(want.double())[1] - 8)  # bfloat16's spacing at the expected value
    assert ((got.double() - want.double()).abs() <= step + 2**-19 * (grad.double().abs() @ back.abs())).all()
    plain = rotated_back(grad.to(triton_backend), None, torch.bfloat16).cpu()
    step = 2.0 ** (torch.frexp(grad.double())[1] - 8)
    assert ((plain.double() - grad.double()).abs() <= step).all()


def saved_forward(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, granularity="block", hadamard=True,
                  causal=False, window_size=(-1, -1)):
    """(dout, quantized, out, lse, signs, opts) on the GPU: what the FP8 autograd function hands its backward op."""
    q, k, v, dout = (x.cuda() for x in make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim))
    quantized = fp8.quantize(q, k, v, hadamard=hadamard, seed=4, granularity=granularity)
    opts = AttentionOptions(head_dim**-0.5, window_size[0], 0 if causal else window_size[1])
    out, lse = ops_fp8.dense(*quantized, opts)
    signs = fp8.random_signs(head_dim, 4, q.device) if hadamard else None
    return dout, quantized, out.to(dout.dtype), lse, signs, opts


def kernel_errors(dout, quantized, out, lse, signs, opts, granularity, monkeypatch) -> dict:
    """The backward op's dQ, dK and dV (the Gluon kernels; the reference path is not called) against
    ``fp8_backward``'s on the same saved tensors: per gradient, the tensor's error norm over its norm and the worst
    row's error over its bound (see the test)."""
    arguments = (dout, *quantized, out, lse, signs, opts.softmax_scale, opts.window_left, opts.window_right,
                 opts.softcap, granularity)
    want = fp8_backward.backward(dout, *quantized[:3], tuple(quantized[3:]), out, lse, signs, opts, granularity)

    def refused(*args, **kwargs):
        raise AssertionError("the reference path ran where the kernels cover the call")

    monkeypatch.setattr(fp8_backward, "backward", refused)
    got = ops_fp8.fp8_attention_backward(*arguments)
    # a single query-key term of a dQ (dK) row without cancellation: softmax_scale |k| (|q|) |dO| |v|, the largest
    # rows'
    q32, k32, v32 = (fp8.dequantize(x, d) for x, d in zip(quantized[:3], quantized[3:], strict=True))
    term = opts.softmax_scale * dout.float().norm(dim=-1).max() * v32.norm(dim=-1).max()
    floors = (1e-3 * (term * k32.norm(dim=-1).max()).item(), 1e-3 * (term * q32.norm(dim=-1).max()).item(), 0.0)
    errors = {}
    for name, grad, expected, floor in zip(("dq", "dk", "dv"), got, want, floors, strict=True):
        assert grad.dtype == expected.dtype and grad.shape == expected.shape and grad.is_contiguous()
        error, expected = grad.double() - expected.double(), expected.double()
        relative = error.norm().item() / (expected.norm().item() + floor + 1e-30)
        rows = row_norms(error) / (2**-5 * row_norms(expected) + floor + 1e-30)
        worst = tuple(int(i) for i in torch.unravel_index(rows.argmax(), rows.shape))
        errors[name] = (relative, rows.max().item(), worst)
    return errors


@pytest.mark.gpu
@pytest.mark.parametrize("shape,options", [
    ((1, 1, 1, 2, 2, 64), {}),  # one query, one key: dK is rounding noise
    ((1, 113, 113, 4, 2, 128), {"causal": True}),
    ((2, 1023, 1023, 4, 1, 64), {}),  # MQA, partial last blocks
    ((1, 113, 1023, 4, 4, 128), {}),
    ((1, 1023, 113, 4, 2, 128), {"causal": True}),  # bottom-right diagonal: most queries see every key
    ((1, 257, 257, 4, 2, 128), {"window_size": (64, 16)}),
    ((1, 257, 300, 2, 2, 64), {"window_size": (-1, 40)}),
], ids=str)
@pytest.mark.parametrize("granularity,hadamard", [("block", True), ("head", False)], ids=str)
def test_gluon_backward_matches_the_reference_path_gpu(triton_backend, monkeypatch, shape, options, granularity,
                                                       hadamard):
    """The Gluon FP8 dK/dV and dQ (``kernels/backward_fp8_hopper.py``, ``kernels/backward_fp8_dq_hopper.py``) against
    ``fp8_backward``'s float32 sums of the same e4m3 operands: the same roundings of P, dS and dO at the same tiles,
    so the two differ by summation order and by the wgmma's sums (S and dP over the head dim, each tile product over
    64 queries or 128 keys, truncated to about 13 fraction bits, never chained across tiles), then wherever that
    moves an e4m3 rounding of P or dS across a boundary. The tensor's error norm stays within 1e-3 of its norm (a
    few e4m3 steps among thousands of terms); a row's within 2^-5 of its norm (one e4m3 step, 2^-4 relative, on a few
    of its terms).

    Rows of pure rounding noise have no norm to be relative to: a query that sees a single key has dS = P (dP - delta)
    = 0 up to rounding (its output is that key's v, rounded to bfloat16: delta = dO . O is dP within 2^-8), so its
    keys' dK rows and its own dQ row are rounding noise in both results (the 1 x 1 case's whole dK and dQ), where one
    e4m3 step of a dS value that sits near a tie moves the row by 2^-4 of itself. dK and dQ are therefore held to an
    absolute floor besides: 1e-3 times one query-key term without cancellation, softmax_scale |q| (|k| for dQ) |dO|
    |v| (the largest rows'), about four such steps of a noise row (2^-8 x 2^-4 of a term each); a wrong row is of the
    size of the term itself. The floor leaves the tensor's bound as it is wherever the tensor holds more than a few
    rows."""
    saved = saved_forward(*shape, granularity, hadamard, causal=options.get("causal", False),
                          window_size=options.get("window_size", (-1, -1)))
    for name, (relative, row, worst) in kernel_errors(*saved, granularity, monkeypatch).items():
        assert relative <= 1e-3 and row <= 1.0, (f"{name}: relative error norm {relative:.2e}; worst row (batch, head, "
                                                 f"token) {worst}: {row:.2f} of its bound")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_backward_walks_causal_tiles_in_sections_gpu(triton_backend, monkeypatch, head_dim):
    """Under a causal mask the Gluon FP8 kernels take their tiles in L2 sections of pairs
    (``backward_fp8_hopper._key_tile``, ``backward_fp8_dq_hopper._query_tile``): with the budgets shrunk to two (batch,
    kv head) pairs' Q and dO, the key tiles of 6 pairs run in sections of 2 and, at head dim 128 (64 fuses dQ into the
    key tiles), the query tiles of 12 (batch, query head) pairs in sections of 6; every tile is computed once (the
    reference path's bounds as above)."""
    shape = (3, 500, 500, 4, 2, head_dim)
    budget = 2 * (2 * 2 * 500 * head_dim * 3)  # a pair's group: Q and dO, float16 and e4m3 transposed copies
    for name in ("HOPPER_L2_SECTION_BYTES", "HOPPER_CAUSAL_L2_SECTION_BYTES"):
        monkeypatch.setattr(configs, name, budget)
    assert l2_section_units(6, budget / 2, budget) == 2
    assert l2_section_units(12, 5 * 500 * head_dim / 2, budget) == 6
    saved = saved_forward(*shape, causal=True)
    for name, (relative, row, worst) in kernel_errors(*saved, "block", monkeypatch).items():
        assert relative <= 1e-3 and row <= 1.0, (f"{name}: relative error norm {relative:.2e}; worst row (batch, head, "
                                                 f"token) {worst}: {row:.2f} of its bound")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,softcap", [(96, 0.0), (64, 5.0)])
def test_calls_the_kernel_does_not_cover_take_the_reference_path_gpu(triton_backend, monkeypatch, head_dim, softcap):
    """Head dims other than 64 and 128, and a softcap, keep the whole reference path."""
    dout, quantized, out, lse, signs, opts = saved_forward(1, 70, 90, 2, 1, head_dim)
    calls = []
    reference_path = fp8_backward.backward

    def recorded(*args, **kwargs):
        calls.append(True)
        return reference_path(*args, **kwargs)

    monkeypatch.setattr(fp8_backward, "backward", recorded)
    ops_fp8.fp8_attention_backward(dout, *quantized, out, lse, signs, opts.softmax_scale, opts.window_left,
                                   opts.window_right, softcap, "block")
    assert calls == [True]


@pytest.mark.interpreter
def test_do_quantizer_writes_delta_from_the_rounded_rows(triton_backend):
    """``quantize_rows_and_delta``, the FP8 backward's dO quantization: dO's bytes and descales as the quantizer
    writes them, and delta = rowsum(dequantized e4m3 dO * O) in the same pass, as the reference path takes it. Block
    descales in one pass (a GQA group of 4, seqlen past a block), per-head ones in two; O a strided view."""
    from flashattn.fp8_format import E4M3_MAX, FP8_DTYPE, SCALE_BLOCK, dequantize
    from flashattn.fp8_quantize import quantize_tensor
    from flashattn.launch.quantize_fp8 import quantize_rows_and_delta

    for (batch, seqlen, nheads, nheads_k, head_dim), granularity in (((2, 130, 4, 1, 64), "block"),
                                                                     ((1, 77, 6, 2, 40), "head")):
        dout = torch.randn(batch, seqlen, nheads, head_dim).to(torch.bfloat16).to(triton_backend)
        o = torch.randn(batch, seqlen, head_dim, nheads).to(torch.bfloat16).to(triton_backend).transpose(2, 3)
        do8, descale, delta = quantize_rows_and_delta(dout, o, nheads_k, SCALE_BLOCK, E4M3_MAX, granularity == "head",
                                                      FP8_DTYPE)
        want8, want_descale = quantize_tensor(dout, nheads_k, granularity)
        assert torch.equal(descale.view(want_descale.shape), want_descale)
        assert torch.equal(do8.view(torch.uint8), want8.view(torch.uint8))
        products = dequantize(want8, want_descale, torch.float64) * o.double()
        want = products.sum(-1).transpose(1, 2)  # (batch, nheads, seqlen)
        assert delta.shape == want.shape and delta.dtype == torch.float32 and delta.is_contiguous()
        # float32 sums in another order: within a few ulps of the sum of magnitudes
        bound = 8 * torch.finfo(torch.float32).eps * products.abs().sum(-1).transpose(1, 2) + 1e-30
        assert ((delta.double() - want).abs() <= bound).all(), granularity


def test_fused_dq_at_head_dim_64_without_deterministic():
    """The FP8 backward computes dQ inside the dK/dV kernel at head dim 64 when the call may add dQ in any order; at
    128 (slower fused) and for deterministic calls it keeps the two passes."""
    from flashattn.launch.backward_fp8 import takes_fused_dq

    assert takes_fused_dq(64, AttentionOptions(0.125))
    assert not takes_fused_dq(64, AttentionOptions(0.125, deterministic=True))
    assert not takes_fused_dq(128, AttentionOptions(0.125))


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_reaches_the_fp8_backward_launch(deterministic, monkeypatch):
    """``fp8.flash_attn_func(..., deterministic=)`` reaches the Gluon backward's launch (which keeps the two passes
    for it): the autograd caller passes it to the op, the op's CUDA kernel into the launch's options."""
    from flashattn.options import FP8Options

    seen = {}

    def op(*args):
        seen["op"] = args[-1]
        return args[1], args[2], args[3]

    monkeypatch.setattr(ops_fp8, "fp8_attention_backward", op)
    q, k, v = (torch.randn(1, 8, 2, 64) for _ in range(3))
    options = FP8Options(AttentionOptions(0.125, deterministic=deterministic), hadamard=False)
    quantized = ops_fp8.Quantized(q, k, v, torch.ones(1, 2, 1), torch.ones(1, 2, 1), torch.ones(1, 2, 1))
    ops_fp8.train_backward(q, quantized, q, torch.zeros(1, 2, 8), None, options)
    assert seen["op"] is deterministic

    def launch(dout, q, k, v, descales, out, lse, signs, opts, granularity):
        seen["launch"] = opts.deterministic
        return q, k, v

    monkeypatch.setattr(ops_fp8, "hopper_fp8_backward_fits", lambda *args: True)
    monkeypatch.setattr(ops_fp8, "launch_backward_fp8", launch)
    ones = torch.ones(1, 2, 1)
    ops_fp8._fp8_attention_backward_cuda(q, q, k, v, ones, ones, ones, q, torch.zeros(1, 2, 8), None, 0.125, -1, -1,
                                         0.0, "block", deterministic)
    assert seen["launch"] is deterministic


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("deterministic", [False, True])
def test_the_next_sequences_nan_stays_out_gpu(head_dim, deterministic):
    """Tiles at a sequence's end reach into the next sequence's rows (the FP8 forward's keys, the backward's query rows,
    their transposed copies' columns): NaN inputs and output gradient in sequence 1 leave sequence 0's output and
    gradients as they are with finite ones (seqlen 300: partial blocks in every kernel). Without ``deterministic`` hdim
    64 takes the fused dK/dV/dQ kernel, whose dQ adds float32 partial sums in whatever order the key tiles finish: two
    calls' dQ may differ by a bf16 unit of its largest values."""
    q, k, v, dout = (x.cuda() for x in make_inputs(2, 300, 300, 4, 2, head_dim, seed=5))
    results = {}
    for poisoned in (False, True):
        inputs = second_sequence_nan((q, k, v, dout), poisoned)
        for causal in (False, True):
            out, grads = fp8_gradients(*inputs[:3], inputs[3], causal=causal, seed=1, deterministic=deterministic)
            results[poisoned, causal] = [out[0], *(g[0] for g in grads)]
    for causal in (False, True):
        for name, clean, poisoned in zip(("out", "dq", "dk", "dv"), results[False, causal], results[True, causal],
                                         strict=True):
            assert_unchanged_by_nan(f"{name}, causal {causal}", clean, poisoned, exact=deterministic or name != "dq")
