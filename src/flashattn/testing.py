"""Input generators and the tolerance rule, shared by the tests, the demo and the benchmark.

The rule is flash-attn's: against a float64 reference, flashattn's error may be at most ``factor``
(2 for outputs, 3 for gradients) times the error of plain PyTorch computing the same thing in the
input precision, plus the rounding error of the reference itself in that precision.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .fp8_format import E4M3_MAX, P_SCALE
from .fp8_quantize import round_to_e4m3
from .masks import visible
from .options import new_rng_state
from .reference import attention_ref, varlen_attention_ref


@dataclass(frozen=True)
class Case:
    """One attention problem: shapes and options."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    head_dim: int
    options: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return (f"b{self.batch}-q{self.seqlen_q}-k{self.seqlen_k}-h{self.nheads}/{self.nheads_k}"
                f"-d{self.head_dim}{_options_label(self.options)}")


def _options_label(options: dict) -> str:
    opts = ",".join(f"{k}={v}" for k, v in options.items() if k != "alibi_slopes")
    if "alibi_slopes" in options:
        opts += ",alibi"
    return f"-{opts}" if opts else ""


@dataclass(frozen=True)
class VarlenCase:
    """One packed (varlen) attention problem: each sequence's query and key lengths, heads, options."""

    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    nheads: int
    nheads_k: int
    head_dim: int
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        assert len(self.seqlens_q) == len(self.seqlens_k), "one key length per query length"

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    def cu_seqlens(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        def running(lengths):
            return torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)

        return running(self.seqlens_q), running(self.seqlens_k)

    def random_inputs(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        total_q, total_k = sum(self.seqlens_q), sum(self.seqlens_k)
        q = torch.randn(total_q, self.nheads, self.head_dim, dtype=dtype, device=device)
        k = torch.randn(total_k, self.nheads_k, self.head_dim, dtype=dtype, device=device)
        v = torch.randn(total_k, self.nheads_k, self.head_dim, dtype=dtype, device=device)
        return q, k, v

    def __str__(self) -> str:
        return (f"q{'/'.join(map(str, self.seqlens_q))}-k{'/'.join(map(str, self.seqlens_k))}"
                f"-h{self.nheads}/{self.nheads_k}-d{self.head_dim}{_options_label(self.options)}")


def random_inputs(case: Case, dtype: torch.dtype, device: str | torch.device, requires_grad: bool = False):
    """Fresh random q, k, v (never zeros), plus ALiBi slopes on ``device`` if the case uses them."""
    q = torch.randn(case.batch, case.seqlen_q, case.nheads, case.head_dim, dtype=dtype, device=device)
    k = torch.randn(case.batch, case.seqlen_k, case.nheads_k, case.head_dim, dtype=dtype, device=device)
    v = torch.randn(case.batch, case.seqlen_k, case.nheads_k, case.head_dim, dtype=dtype, device=device)
    for x in (q, k, v):
        x.requires_grad_(requires_grad)
    return q, k, v


def max_error_report(name: str, actual: torch.Tensor, expected: torch.Tensor) -> str:
    diff = (actual.double() - expected.double()).abs()
    flat = int(diff.argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return (f"{name}: max error {diff.max().item():.3e} at {where}, mean {diff.mean().item():.3e}, "
            f"got {actual.reshape(-1)[flat].item():.6g}, expected {expected.reshape(-1)[flat].item():.6g}")


def rounding_error(oracle: torch.Tensor, dtype: torch.dtype) -> float:
    """Max |oracle rounded to ``dtype`` - oracle|: what no ``dtype`` result can do better than."""
    return (oracle.double().to(dtype).double() - oracle.double()).abs().max().item()


def error_bound(baseline_error: float, rounding: float, factor: float) -> float:
    """flash-attn's rule: ``factor`` x plain PyTorch's error, plus twice the unavoidable rounding."""
    return factor * baseline_error + 2 * rounding


def assert_within_rule(name: str, actual: torch.Tensor, oracle: torch.Tensor, baseline: torch.Tensor,
                       factor: float, floor: float = 0.0) -> None:
    """Assert |actual - oracle| <= factor * |baseline - oracle| + 2 * rounding (max norms).

    The rounding term is the larger of the oracle's rounding to the output dtype and ``floor``, the
    rounding that the algorithm cannot avoid (see the gradients in ``check_against_reference``). The
    floor matters only where the exact answer is 0 (a gradient through a softmax over one key) and
    PyTorch happens to hit that 0 exactly.
    """
    assert actual.shape == oracle.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(oracle.shape)}"
    assert torch.isfinite(actual).all(), f"{name}: has non-finite values"
    oracle = oracle.double()
    error = (actual.double() - oracle).abs().max().item()
    baseline_error = (baseline.double() - oracle).abs().max().item()
    rounding = max(rounding_error(oracle, actual.dtype), floor)
    bound = error_bound(baseline_error, rounding, factor)
    assert error <= bound, (
        f"{name}: error {error:.3e} > {factor} x PyTorch's {baseline_error:.3e} + 2 x rounding {rounding:.3e}\n"
        + max_error_report(name, actual, oracle)
    )


def assert_lse_close(lse: torch.Tensor, oracle_lse: torch.Tensor, dtype: torch.dtype) -> None:
    """The log-sum-exp is float32 whatever the input dtype; +inf marks rows that see no key."""
    assert lse.dtype == torch.float32
    empty = torch.isinf(oracle_lse)
    assert torch.equal(torch.isinf(lse), empty), "lse: +inf rows differ from the reference's empty rows"
    # the scores are rounded products of dtype inputs: allow a few ulps of the dtype at the lse's scale
    tolerance = 8 * torch.finfo(dtype).eps * (1 + oracle_lse[~empty].abs().max().item() if (~empty).any() else 1)
    error = (lse[~empty].double() - oracle_lse[~empty]).abs().max().item() if (~empty).any() else 0.0
    assert error <= tolerance, f"lse: max error {error:.3e} > {tolerance:.3e}"


def score_grad_floor(dout: torch.Tensor, out: torch.Tensor, out_oracle: torch.Tensor, v: torch.Tensor,
                     dropout_p: float = 0.0) -> float:
    """The rounding that dS = P * (dP - delta), the gradient of the scores, cannot avoid.

    It cancels terms of size |dO . v| / (1 - p) in float32, and delta is rowsum(dO * O) of O as stored
    in the input dtype (as in flash-attn). Tensors may be in either layout: the head dim is last.
    """
    delta_error = (dout.double() * (out.double() - out_oracle.detach().double())).sum(-1).abs().max().item()
    # |dO_i . v_j| <= |dO_i| |v_j|: a dot product of that size rounds by about eps times it
    cancelled = (dout.float().norm(dim=-1).max() * v.float().norm(dim=-1).max()).item() / (1.0 - dropout_p)
    return torch.finfo(torch.float32).eps * cancelled + delta_error


def check_against_reference(case: Case, dtype: torch.dtype, device: str | torch.device, attention_fn,
                            backward: bool = True, inputs=None, reference_fn=attention_ref) -> None:
    """Run ``attention_fn(q, k, v, **options, return_attn_probs=True)`` and hold it to the rule.

    The dropout stream is drawn after ``torch.manual_seed(0)``, so the reference replays it exactly.
    ``reference_fn`` is called as ``attention_ref`` is (the varlen check passes the per-sequence one).
    """

    def run(q, k, v, options):
        q, k, v = (x.detach().requires_grad_(backward) for x in (q, k, v))
        out, lse, _ = attention_fn(q, k, v, return_attn_probs=True, **options)
        return out, lse, lambda dout: torch.autograd.grad(out, (q, k, v), dout)

    check_run_against_reference(case, dtype, device, run, backward, inputs, reference_fn)


def check_run_against_reference(case: Case, dtype: torch.dtype, device: str | torch.device, run,
                                backward: bool = True, inputs=None, reference_fn=attention_ref) -> None:
    """:func:`check_against_reference` for any way of computing attention: ``run(q, k, v, options)`` returns
    ``(out, lse, gradients)``, where ``gradients(dout)`` gives (dq, dk, dv) of the full q, k and v (a sharded
    computation gathers its results, ``tests/ring_cases.py``)."""
    q, k, v = inputs if inputs is not None else random_inputs(case, dtype, device)
    q, k, v = (x.detach() for x in (q, k, v))
    options = dict(case.options)
    dropout_p = options.get("dropout_p", 0.0)
    torch.manual_seed(0)
    out, lse, gradients = run(q, k, v, options)
    torch.manual_seed(0)
    rng_state = new_rng_state() if dropout_p > 0 else None
    ref_options = {key: value for key, value in options.items() if key != "deterministic"}

    def reference(upcast: bool):
        leaves = [x.detach().clone().requires_grad_(backward) for x in (q, k, v)]
        if upcast:
            leaves = [x.detach().double().requires_grad_(backward) for x in leaves]
        out_ref, lse_ref = reference_fn(*leaves, rng_state=rng_state, upcast=upcast, **ref_options)
        return leaves, out_ref, lse_ref

    oracle_leaves, out_oracle, lse_oracle = reference(upcast=True)
    baseline_leaves, out_baseline, _ = reference(upcast=False)
    assert out.dtype == dtype and out.shape == q.shape
    assert_within_rule("out", out, out_oracle, out_baseline, factor=2)
    assert_lse_close(lse, lse_oracle, dtype)
    if not backward:
        return
    dout = torch.randn_like(out)
    grads = gradients(dout)
    oracle_grads = torch.autograd.grad(out_oracle, oracle_leaves, dout.double(), retain_graph=True)
    baseline_grads = torch.autograd.grad(out_baseline, baseline_leaves, dout)
    # dS reaches dq/dk through one more product with q or k and the softmax scale.
    softmax_scale = options.get("softmax_scale") or case.head_dim**-0.5
    grad_floor = score_grad_floor(dout, out, out_oracle, v, dropout_p)
    grad_floor *= torch.maximum(q.abs().max(), k.abs().max()).item() * softmax_scale
    # dq_i sums dS_ij over keys with weights P_ij that add up to 1; dk_j sums them over every query (and
    # every head of the GQA group) with weights that add up to P's column sum, so each row's delta error
    # can add up to that many times: a key that is a sequence's only one has a column sum of Sq x group.
    # dV of the oracle for dO = 1 is that column sum.
    column_sums = torch.autograd.grad(out_oracle, oracle_leaves[2], torch.ones_like(out_oracle))[0]
    floors = {"dq": grad_floor, "dk": grad_floor * max(1.0, column_sums.abs().max().item()), "dv": grad_floor}
    for name, grad, oracle, baseline in zip(("dq", "dk", "dv"), grads, oracle_grads, baseline_grads, strict=True):
        assert grad.dtype == dtype
        assert_within_rule(name, grad, oracle, baseline, factor=3, floor=floors[name])


def page_keys(k: torch.Tensor, v: torch.Tensor, cu_seqlens_k: torch.Tensor, page_size: int, spare_pages: int = 3,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed k, v (total_k, Hk, D) copied into page pools through a block table: ``(k_pages, v_pages, table)``.

    Pools are (num_pages, page_size, Hk, D), the pages in a random order with ``spare_pages`` that no
    sequence owns; the table is int32 (batch, max_pages + 1). Everything no key owns is poisoned, so that
    reading it would show: rows past a sequence's end and spare pages hold NaN, table entries past a
    sequence's last page hold page indices outside the pool.
    """
    bounds = cu_seqlens_k.tolist()
    lengths = [end - start for start, end in zip(bounds, bounds[1:], strict=False)]
    pages_per_seq = [-(-n // page_size) for n in lengths]
    num_pages = sum(pages_per_seq) + spare_pages
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
    table = torch.tensor([[-1 - b, num_pages + b] * (max(pages_per_seq) // 2 + 1) for b in range(len(lengths))],
                         dtype=torch.int32)[:, : max(pages_per_seq) + 1]
    pools = [torch.full((num_pages, page_size, *x.shape[1:]), float("nan"), dtype=x.dtype, device=x.device)
             for x in (k, v)]
    for b, (start, length) in enumerate(zip(bounds, lengths, strict=False)):
        for column in range(pages_per_seq[b]):
            page = order.pop()
            table[b, column] = page
            rows = slice(start + column * page_size, start + min(length, (column + 1) * page_size))
            for pool, x in zip(pools, (k, v), strict=True):
                pool[page, : rows.stop - rows.start] = x[rows]
    return pools[0], pools[1], table.to(k.device)


def check_varlen_against_reference(case: VarlenCase, dtype: torch.dtype, device: str | torch.device,
                                   backward: bool = True, max_seqlens=None, inputs=None,
                                   page_size: int | None = None) -> None:
    """:func:`check_against_reference` for ``flash_attn_varlen_func`` against the per-sequence reference.

    ``max_seqlens`` overrides the (max_seqlen_q, max_seqlen_k) passed (ints or 0-d tensors); by default
    they are the longest sequences. ``page_size``: the call reads k and v through a block table, from
    pages of that size (:func:`page_keys`); it is forward only, so ``backward`` must be False.
    """
    from .varlen import flash_attn_varlen_func

    cu_seqlens_q, cu_seqlens_k = case.cu_seqlens(device)
    if max_seqlens is None:
        max_seqlens = (max(case.seqlens_q), max(case.seqlens_k))
    attention_fn = functools.partial(flash_attn_varlen_func, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                     max_seqlen_q=max_seqlens[0], max_seqlen_k=max_seqlens[1])
    if page_size is not None:
        assert not backward, "a paged call is forward only"
        packed_fn = attention_fn

        def attention_fn(q, k, v, **options):
            k_pages, v_pages, table = page_keys(k.detach(), v.detach(), cu_seqlens_k, page_size)
            return packed_fn(q, k_pages, v_pages, block_table=table, **options)
    reference_fn = functools.partial(varlen_attention_ref, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    inputs = inputs if inputs is not None else case.random_inputs(dtype, device)
    check_against_reference(case, dtype, device, attention_fn, backward, inputs, reference_fn)


def fp8_emulated_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float | None = None,
                           causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           block_n: int = 128, round_p: bool = True) -> torch.Tensor:
    """The FP8 kernel's arithmetic in float64 on dequantized q, k, v (B, S, H, D): key blocks of ``block_n`` in order,
    the online softmax's P = exp(S - running max) rounded to e4m3 after scaling by ``fp8.P_SCALE`` (``round_p``),
    the row sum of the unrounded P. Returns float64 out; rows that see no key give 0.

    Against the float64 reference this measures what rounding P costs at these inputs; the kernel then differs
    from it by float32 arithmetic only (and the ties of P's rounding that float32 moves)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size[0], 0 if causal else window_size[1]
    qf = q.double().transpose(1, 2)  # (B, H, Sq, D)
    kf = k.double().transpose(1, 2).repeat_interleave(nheads // nheads_k, dim=1)
    vf = v.double().transpose(1, 2).repeat_interleave(nheads // nheads_k, dim=1)
    row_max = torch.full((batch, nheads, seqlen_q, 1), float("-inf"), dtype=torch.float64, device=q.device)
    row_sum = torch.zeros_like(row_max)
    acc = torch.zeros_like(qf)
    query_idx = torch.arange(seqlen_q, device=q.device).view(-1, 1)
    for start in range(0, seqlen_k, block_n):
        end = min(start + block_n, seqlen_k)
        s = (qf @ kf[:, :, start:end].transpose(-1, -2)) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        key_idx = torch.arange(start, end, device=q.device).view(1, -1)
        s = s.masked_fill(~visible(query_idx, key_idx, seqlen_q, seqlen_k, left, right), float("-inf"))
        new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
        shift = new_max.masked_fill(new_max == float("-inf"), 0.0)
        p = torch.exp(s - shift)
        correction = torch.exp(row_max - shift)
        row_sum = row_sum * correction + p.sum(dim=-1, keepdim=True)
        if round_p:
            p = round_to_e4m3(p * P_SCALE) / P_SCALE
        acc = acc * correction + p @ vf[:, :, start:end]
        row_max = new_max
    out = acc / row_sum.masked_fill(row_sum == 0, 1.0)
    return out.transpose(1, 2)


def assert_fp8_within_rule(name: str, actual: torch.Tensor, oracle: torch.Tensor, emulated: torch.Tensor,
                           factor: float = 2.0) -> None:
    """The FP8 rule: against the float64 ``oracle`` on the dequantized inputs, the kernel's bfloat16 output may be
    off by at most ``factor`` times the error of the emulated kernel arithmetic (``fp8_emulated_attention``, rounded
    to bfloat16 as the kernel's output is): the rounding of P to e4m3, about 2^-4 of each probability, dominates
    both, and what remains (float32 sums, the ties of that rounding) must stay within the factor."""
    emulated_error = (emulated.to(torch.bfloat16).double() - oracle).abs().max().item()
    bound = factor * emulated_error + rounding_error(oracle, torch.bfloat16)
    error = (actual.double() - oracle).abs().max().item()
    assert error <= bound, (f"{name}: error {error:.3e} > bound {bound:.3e} (emulated FP8 error {emulated_error:.3e})"
                            f"; {max_error_report(name, actual.double(), oracle)}")


E4M3_UNIT_ROUNDOFF = 2.0 ** -4  # half an ulp of e4m3 relative to the value: 3 stored mantissa bits
E4M3_HALF_SUBNORMAL = 2.0 ** -10  # half e4m3's smallest subnormal step (2^-9), in units of the descale


def _rounding_variance(x: torch.Tensor, descale: torch.Tensor | float) -> torch.Tensor:
    """Upper bound of the variance of x's rounding to e4m3 under ``descale``: an error uniform within half an ulp,
    u |x| in the normal range and half the subnormal step below it."""
    floor = E4M3_HALF_SUBNORMAL * torch.as_tensor(descale, dtype=x.dtype, device=x.device)
    half_ulp = torch.maximum(E4M3_UNIT_ROUNDOFF * x.abs(), floor)
    return half_ulp.square() / 3


@dataclass(frozen=True)
class FP8GradientBound:
    """The first-order error model of the FP8 backward (``fp8_backward``), per gradient row: ``rms`` (the predicted
    root-mean-square error norm of each row) and ``offset`` (the norm of the error the model takes as given: delta's
    use of the forward's rounded output). Rows: (batch, heads, seqlen, ...) in the rotated basis, whose row norms the
    rotation back to q's basis does not change."""

    rms: dict
    offset: dict


def fp8_gradient_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, out: torch.Tensor,
                       softmax_scale: float, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                       softcap: float = 0.0) -> FP8GradientBound:
    """The FP8 backward's predicted error on q, k (the rotated, dequantized values its products see), v, dout and
    the forward's output ``out`` (all (B, S, H, D), any float dtype; materializes seqlen_q x seqlen_k in float64).

    Each of dO, P and dS is rounded to e4m3 once, an error within half an ulp (u = 2^-4 of the value, or half the
    subnormal step under its descale), modelled as uniform and independent between elements, so a sum of such
    errors has a variance of sum (coefficient^2 half_ulp^2 / 3). The coefficients are the float64 values of the
    products they enter: dV = P^T dO; dK = scale dS^T Q and dQ = scale dS K, where dS = P (dP - delta) c carries dO's
    error through dP - delta = dO . (v_j - O_i) (delta and dP see the same rounded dO and the returned output O; c
    is the softcap's derivative). Each descale is bounded by its batch element's amax / 448, which can only raise
    the subnormal term."""
    f64 = torch.float64
    batch, seqlen_q, nheads, head_dim = q.shape
    group = nheads // k.shape[2]
    qf, dof, of = (x.to(f64).transpose(1, 2) for x in (q, dout, out))  # (B, H, Sq, D)
    kf, vf = (x.to(f64).transpose(1, 2).repeat_interleave(group, dim=1) for x in (k, v))
    scores = softmax_scale * qf @ kf.transpose(-1, -2)
    slope = torch.ones_like(scores)
    if softcap > 0:
        capped = torch.tanh(scores / softcap)
        scores, slope = softcap * capped, 1 - capped.square()
    query_idx = torch.arange(seqlen_q, device=q.device).view(-1, 1)
    key_idx = torch.arange(k.shape[1], device=q.device).view(1, -1)
    seen = visible(query_idx, key_idx, seqlen_q, k.shape[1], window_size[0], 0 if causal else window_size[1])
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1).nan_to_num(0.0)
    out_exact = probs @ vf
    dscores = probs * (dof @ vf.transpose(-1, -2) - (dof * out_exact).sum(-1, keepdim=True)) * slope
    weight = probs * slope  # dS's sensitivity to dP - delta
    # the path's dP - delta = dO8 . (v_j - O_i) with O as the forward returned it splits exactly into the exact value,
    # dO's rounding times (v_j - O_i), and dO . (O_exact - O_i), a given row-wise error (the offset)
    delta_error = (dof * (of - out_exact)).sum(-1, keepdim=True)
    everything = (1, 2, 3)  # a batch element's amax bounds each of its descales (a GQA group shares them)
    var_do = _rounding_variance(dof, dof.abs().amax(dim=everything, keepdim=True) / E4M3_MAX)
    var_p = _rounding_variance(probs, 1.0 / P_SCALE)
    ds_seen = dscores.abs() + (weight * delta_error).abs()  # what dS's rounding applies to, at most
    var_ds = _rounding_variance(ds_seen, ds_seen.amax(dim=everything, keepdim=True) / E4M3_MAX)
    # w_ij = sum_d var(dO_id) (v_jd - O_id)^2: the variance dO's rounding gives dP_ij - delta_i
    w = var_do @ vf.square().transpose(-1, -2) - 2 * (var_do * of) @ vf.transpose(-1, -2) \
        + (var_do * of.square()).sum(-1, keepdim=True)
    var_dv = probs.square().transpose(-1, -2) @ var_do + var_p.transpose(-1, -2) @ dof.square()
    var_dk = softmax_scale ** 2 * (var_ds + weight.square() * w).transpose(-1, -2) @ qf.square()
    # dQ_i sums one row's dO error over every key, coherently: its dO term is sum_x var(dO_ix) (T_ixd)^2
    coherent = torch.einsum("bhij,bhjx,bhjd->bhixd", weight, vf, kf) - of[..., None] * (weight @ kf)[..., None, :]
    var_dq = softmax_scale ** 2 * (var_ds @ kf.square() + torch.einsum("bhix,bhixd->bhid", var_do, coherent.square()))
    offset_dq = softmax_scale * (weight * delta_error) @ kf
    offset_dk = softmax_scale * (weight * delta_error).transpose(-1, -2) @ qf

    def per_kv_head(x):  # (B, H, Sk, D) -> (B, Hk, Sk, D): the group's heads add up
        return x.unflatten(1, (-1, group)).sum(2)

    rms = {"dq": var_dq.sum(-1).sqrt(), "dk": per_kv_head(var_dk).sum(-1).sqrt(),
           "dv": per_kv_head(var_dv).sum(-1).sqrt()}
    offset = {"dq": offset_dq.norm(dim=-1), "dk": per_kv_head(offset_dk).norm(dim=-1),
              "dv": torch.zeros_like(rms["dv"])}
    return FP8GradientBound(rms, offset)
