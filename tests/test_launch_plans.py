"""Launch plans on the GPU (``plans.record_or_replay``): a call replayed from the plan of an earlier
call of the same signature must compute exactly what the call computes on its own path, on new inputs, with its
outputs in memory that held NaNs; and calls whose launches a plan cannot fix must not get one. Dense, packed
(varlen) and KV-cache calls."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hopper_kernels import hopper

from flashattn import configs, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn.launch import backward as launch_backward
from flashattn.launch import plans

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, causal, window): the Hopper kernels (head dims 64,
# 128 and 256 in 16 bits), the Triton ones (96, 40, float32), GQA, unequal lengths and a sliding window
CASES = [
    (torch.bfloat16, 2, 128, 128, 4, 4, 64, False, (-1, -1)),
    (torch.bfloat16, 2, 200, 200, 8, 2, 128, True, (-1, -1)),
    (torch.float16, 1, 113, 300, 4, 4, 256, True, (-1, -1)),
    (torch.bfloat16, 2, 1023, 1023, 2, 2, 96, False, (-1, -1)),
    (torch.float32, 1, 77, 77, 2, 1, 40, True, (-1, -1)),
    (torch.bfloat16, 1, 300, 300, 4, 4, 128, False, (64, 0)),
]


@contextlib.contextmanager
def own_path(monkeypatch):
    """Inside the block every call takes its own path, as if no plan had been recorded."""
    with monkeypatch.context() as patch:
        patch.setattr(plans, "record_or_replay", lambda key, inputs, call, *args: call())
        yield


def _inputs(dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=generator)

    q = randn(batch, seqlen_q, nheads, head_dim)
    k, v = randn(batch, seqlen_k, nheads_k, head_dim), randn(batch, seqlen_k, nheads_k, head_dim)
    return q, k, v, randn(batch, seqlen_q, nheads, head_dim)


def _forward_backward(q, k, v, dout, causal, window):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = flash_attn_func(q, k, v, causal=causal, window_size=window)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))


def _poison_allocator(tensors) -> None:
    """Fill blocks of each tensor's size with NaN and free them: the caching allocator hands them to the next
    allocations of those sizes, so an output that a replay allocates but no kernel writes shows."""
    blocks = [torch.full_like(x, float("nan")) for x in tensors for _ in range(2)]
    del blocks


@pytest.fixture
def replays(monkeypatch):
    """How many calls a plan replayed."""
    count = []
    original = plans.LaunchPlan.replay

    def counting(self, inputs):
        count.append(len(inputs))
        return original(self, inputs)

    monkeypatch.setattr(plans.LaunchPlan, "replay", counting)
    return count


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}-hdim{c[6]}-{c[2]}x{c[3]}-causal{c[7]}")
def test_a_replayed_call_computes_exactly_what_the_call_computes(case, monkeypatch, replays):
    dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, causal, window = case
    first = _inputs(dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, seed=1)
    second = _inputs(dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, seed=2)
    with own_path(monkeypatch):
        expected = _forward_backward(*second, causal, window)
    _forward_backward(*first, causal, window)  # records the forward's and the backward's plans
    assert not replays
    _poison_allocator(expected)
    replayed = _forward_backward(*second, causal, window)
    assert len(replays) == 2, "the forward and the backward are replayed"
    for name, got, want in zip(("out", "dq", "dk", "dv"), replayed, expected, strict=True):
        assert torch.equal(got, want), f"{name} differs from the call's own path"


# (head_dim, seqlen_q, seqlen_k, causal, granularity, softcap): the Gluon kernel (hdim 64, 128, 256; keys not a
# multiple of V^T's 32-key rows) and the Triton one (hdim 96, or a softcap)
FP8_CASES = [(128, 200, 113, True, "block", 0.0), (256, 130, 300, False, "head", 0.0),
             (64, 64, 64, False, "block", 0.0), (96, 77, 150, True, "block", 0.0), (128, 100, 100, False, "head", 30.0)]


@pytest.mark.parametrize("head_dim,seqlen_q,seqlen_k,causal,granularity,softcap", FP8_CASES, ids=str)
def test_a_replayed_fp8_call_computes_exactly_what_the_call_computes(head_dim, seqlen_q, seqlen_k, causal,
                                                                     granularity, softcap, monkeypatch, replays):
    """The FP8 forward's plan (its V^T copy, a new tensor that the attention kernel reads); V^T's rows are allocated
    from NaN-filled blocks, so a key that the copy leaves unwritten shows. A fixed seed: the quantizer's rotation
    draws new signs on every call without one."""
    from flashattn import fp8

    def call(inputs):
        x = fp8.quantize(*inputs[:3], seed=0, granularity=granularity)
        return flash_attn_func(*x[:3], q_descale=x.q_descale, k_descale=x.k_descale, v_descale=x.v_descale,
                               causal=causal, softcap=softcap)

    first, second = (_inputs(torch.bfloat16, 2, seqlen_q, seqlen_k, 4, 2, head_dim, seed=s) for s in (5, 6))
    with own_path(monkeypatch):
        expected = call(second)
    call(first)
    assert not replays
    _poison_allocator([expected])
    vt_bytes = 2 * 2 * head_dim * -(-seqlen_k // 32) * 32  # (batch, nheads_k, head_dim, keys rounded up to 32)
    blocks = [torch.full((vt_bytes,), 0x7F, dtype=torch.uint8, device="cuda") for _ in range(2)]  # 0x7F: e4m3's NaN
    del blocks
    got = call(second)
    assert len(replays) == 1, "the FP8 forward is replayed"
    assert torch.equal(got, expected)


# (head_dim, seqlen_q, seqlen_k, nheads_k, causal, hadamard) of the trainable FP8 call: its backward in two passes
# with the rotation (GQA, unequal lengths), with dQ inside the dK/dV kernel (head dim 64: two key blocks add into each
# dQ row, in either order the same float32 sum), and without the rotation
TRAIN_FP8_CASES = [(128, 200, 300, 2, True, True), (64, 130, 130, 4, False, True), (128, 64, 64, 4, False, False)]


@pytest.mark.parametrize("head_dim,seqlen_q,seqlen_k,nheads_k,causal,hadamard", TRAIN_FP8_CASES, ids=str)
def test_a_replayed_fp8_training_step_computes_exactly_what_the_step_computes(head_dim, seqlen_q, seqlen_k, nheads_k,
                                                                              causal, hadamard, monkeypatch, replays):
    """``fp8.flash_attn_func``'s two plans: the forward's (the quantizer's kernels, its S from the call's signs, the
    attention) and the backward's (dO's quantizer, the descales, the float16 and transposed copies, the kernels, the
    rotation back), replayed for other inputs and another rotation seed (a call's signs are an input, not part of the
    key), outputs in NaN-filled memory."""
    from flashattn import fp8

    def step(inputs, seed):
        q, k, v = (x.detach().requires_grad_() for x in inputs[:3])
        out = fp8.flash_attn_func(q, k, v, causal=causal, hadamard=hadamard, seed=seed)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), inputs[3]))

    first, second = (_inputs(torch.bfloat16, 2, seqlen_q, seqlen_k, 4, nheads_k, head_dim, seed=s) for s in (7, 8))
    with own_path(monkeypatch):
        expected = step(second, 12)
    step(first, 11)
    assert not replays
    _poison_allocator(expected)
    replayed = step(second, 12)
    assert len(replays) == 2, "the FP8 forward and backward are replayed"
    for name, got, want in zip(("out", "dq", "dk", "dv"), replayed, expected, strict=True):
        assert torch.equal(got, want), f"{name} differs from the call's own path"


def test_calls_with_dropout_alibi_or_a_strided_last_dimension_take_their_own_path(replays):
    q, k, v, dout = _inputs(torch.bfloat16, 1, 64, 64, 2, 2, 64, seed=3)
    slopes = torch.rand(2, device="cuda", dtype=torch.float32)
    strided = torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)[..., ::2]
    for _ in range(2):
        flash_attn_func(q, k, v, dropout_p=0.1)
        flash_attn_func(q, k, v, alibi_slopes=slopes)
        flash_attn_func(strided, k, v)
    assert not plans._PLANS and not replays


def test_a_call_on_one_tensor_as_q_k_and_v_does_not_replay_for_three(monkeypatch):
    x, k, v, dout = _inputs(torch.bfloat16, 2, 128, 128, 4, 4, 128, seed=7)
    q = torch.randn_like(x)
    with own_path(monkeypatch):
        expected = _forward_backward(q, k, v, dout, True, (-1, -1))
    for _ in range(2):
        flash_attn_func(x, x, x, causal=True)  # records (and then replays) the plan of one tensor thrice
        got = _forward_backward(q, k, v, dout, True, (-1, -1))
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


def test_an_unaligned_input_gets_its_own_plan(monkeypatch):
    """A 16-byte aligned call takes the TMA kernels; one shifted by an element cannot, and must not replay them."""
    q, k, v, dout = _inputs(torch.bfloat16, 1, 96, 96, 2, 2, 128, seed=4)
    buffer = torch.randn(q.numel() + 1, device="cuda", dtype=torch.bfloat16)
    shifted = buffer[1:].view_as(q)
    shifted.copy_(q)
    assert shifted.data_ptr() % 16 != 0
    with own_path(monkeypatch):
        expected = _forward_backward(shifted, k, v, dout, True, (-1, -1))
    for _ in range(2):
        _forward_backward(q, k, v, dout, True, (-1, -1))
        got = _forward_backward(shifted, k, v, dout, True, (-1, -1))
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


def test_a_replay_takes_the_two_gradient_streams(monkeypatch, replays):
    joins = []
    original_join = launch_backward.GradientStreams.join
    monkeypatch.setattr(launch_backward.GradientStreams, "join", lambda self: (joins.append(1), original_join(self))[1])
    monkeypatch.setattr(configs, "CONCURRENT_GRADIENTS_MIN_FLOPS", 0)
    q, k, v, dout = _inputs(torch.bfloat16, 2, 256, 256, 4, 4, 128, seed=5)
    with own_path(monkeypatch):
        expected = _forward_backward(q, k, v, dout, True, (-1, -1))
    joins.clear()
    for _ in range(3):
        got = _forward_backward(q, k, v, dout, True, (-1, -1))
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)
    assert len(joins) == 3 and len(replays) == 4  # the second and third forward and backward


@hopper
def test_a_replayed_persistent_forward_starts_from_a_zero_tile_counter(monkeypatch, replays):
    # the causal persistent Hopper forward takes its tiles from a counter that every call zeroes (launcher.zeros);
    # a replay that left it as the last call did would compute each program's first tile only
    persistent = configs.TileConfig(128, 128, 8, 2, hopper=True, persistent=True)
    q, k, v, _ = _inputs(torch.bfloat16, 2, 1500, 1500, 8, 8, 128, seed=3)
    with configs.use_config("forward", persistent):
        with own_path(monkeypatch):
            expected = flash_attn_func(q, k, v, causal=True)
        flash_attn_func(q, k, v, causal=True)  # records the plan
        _poison_allocator([expected])
        replayed = [flash_attn_func(q, k, v, causal=True) for _ in range(2)]
    assert len(replays) == 2
    for out in replayed:
        assert torch.equal(out, expected)


def test_replays_are_captured_by_a_cuda_graph(monkeypatch):
    q, k, v, dout = _inputs(torch.bfloat16, 2, 512, 512, 4, 4, 128, seed=6)
    with own_path(monkeypatch):
        expected = _forward_backward(q, k, v, dout, True, (-1, -1))
    static = [x.clone() for x in _inputs(torch.bfloat16, 2, 512, 512, 4, 4, 128, seed=7)]
    static_q, static_k, static_v = (x.requires_grad_() for x in static[:3])
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        for _ in range(2):  # records the plans, then replays them, before the capture
            _forward_backward(*static, True, (-1, -1))
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_func(static_q, static_k, static_v, causal=True)
        grads = torch.autograd.grad(out, (static_q, static_k, static_v), static[3])
    with torch.no_grad():
        for target, source in zip(static, (q, k, v, dout), strict=True):
            target.copy_(source)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip((out, *grads), expected, strict=True):
        assert torch.equal(a, b)


def _packed(lengths_q, lengths_k, nheads, nheads_k, head_dim, seed):
    """Packed q, k, v, dout and int32 cu_seqlens on the GPU for the given sequence lengths."""
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator)

    def cumulative(lengths):
        return torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)

    q, dout = randn(sum(lengths_q), nheads, head_dim), randn(sum(lengths_q), nheads, head_dim)
    k, v = randn(sum(lengths_k), nheads_k, head_dim), randn(sum(lengths_k), nheads_k, head_dim)
    return q, k, v, dout, cumulative(lengths_q), cumulative(lengths_k)


def _varlen_forward_backward(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))


@pytest.mark.parametrize("head_dim,causal", [(128, True), (64, False), (96, True)])
def test_a_replayed_varlen_call_follows_its_own_cu_seqlens(head_dim, causal, monkeypatch, replays):
    """The plan is recorded on one cut of the tokens and replayed on another with the same totals and maxima:
    cu_seqlens are read on the GPU, so the replay must follow the new cut (empty and one-token sequences, GQA)."""
    first = _packed([100, 0, 1, 155], [90, 3, 1, 162], 8, 2, head_dim, seed=8)
    second = _packed([155, 1, 100, 0], [162, 90, 1, 3], 8, 2, head_dim, seed=9)
    with own_path(monkeypatch):
        expected = _varlen_forward_backward(*second, 155, 162, causal)
    _varlen_forward_backward(*first, 155, 162, causal)
    assert not replays
    _poison_allocator(expected)
    replayed = _varlen_forward_backward(*second, 155, 162, causal)
    assert len(replays) == 2, "the forward and the backward are replayed"
    for name, got, want in zip(("out", "dq", "dk", "dv"), replayed, expected, strict=True):
        assert torch.equal(got, want), f"{name} differs from the call's own path"


def test_varlen_calls_with_other_maxima_or_derived_ones_take_their_own_path(monkeypatch, replays):
    q, k, v, dout, cu_q, cu_k = _packed([64, 64], [64, 64], 4, 4, 128, seed=10)
    maximum = torch.tensor(64, device="cuda")  # a tensor: the maximum is derived on the host, never planned
    # longer maxima than the sequences need: larger grids (and maybe other tiles), each recorded on its own
    for max_q, max_k in ((64, 64), (128, 64), (64, 128), (maximum, maximum)):
        with own_path(monkeypatch):
            expected = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
        for _ in range(2):
            assert torch.equal(flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k), expected)
    assert len(replays) == 3


def _decode_step_inputs(batch, capacity, page_size, seed):
    """A one-token decode step with an append (GQA 32/8, hdim 128): random caches and cache_seqlens; paged caches
    get their pages in a random order."""
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator)

    k_cache, v_cache = randn(batch, capacity, 8, 128), randn(batch, capacity, 8, 128)
    inputs = dict(q=randn(batch, 1, 32, 128), k=randn(batch, 1, 8, 128), v=randn(batch, 1, 8, 128),
                  cache_seqlens=torch.randint(0, capacity, (batch,), device="cuda", dtype=torch.int32,
                                              generator=generator))
    if page_size is None:
        return dict(inputs, k_cache=k_cache, v_cache=v_cache)
    pages = batch * capacity // page_size
    order = torch.randperm(pages, device="cuda", generator=generator)
    pool = [torch.empty_like(c.reshape(pages, page_size, 8, 128)) for c in (k_cache, v_cache)]
    for paged, cache in zip(pool, (k_cache, v_cache), strict=True):
        paged[order] = cache.reshape(pages, page_size, 8, 128)
    return dict(inputs, k_cache=pool[0], v_cache=pool[1], block_table=order.view(batch, -1).to(torch.int32))


def _decode_step(inputs, check_indices=False):
    arguments = dict(inputs, k_cache=inputs["k_cache"].clone(), v_cache=inputs["v_cache"].clone())
    out, lse = flash_attn_with_kvcache(**arguments, causal=True, return_softmax_lse=True, check_indices=check_indices)
    return out, lse, arguments["k_cache"], arguments["v_cache"]


# (batch, page size): split with a merge (batch 1), unsplit with the streaming stages (40 x 8 programs), paged.
# Unchecked indices: the whole step is planned (kvcache._plannable_step); checked ones: the op.
@pytest.mark.parametrize("check_indices", [False, True], ids=["step-planned", "op-planned"])
@pytest.mark.parametrize("batch,page_size", [(1, None), (40, None), (2, 256)])
def test_a_replayed_decode_step_follows_its_own_cache_seqlens(batch, page_size, check_indices, monkeypatch,
                                                              replays):
    first, second = (_decode_step_inputs(batch, 2048, page_size, seed) for seed in (11, 12))
    with own_path(monkeypatch):
        expected = _decode_step(second, check_indices)
    _decode_step(first, check_indices)
    assert not replays
    _poison_allocator(expected)
    replayed = _decode_step(second, check_indices)
    assert len(replays) == 1
    for name, got, want in zip(("out", "lse", "k_cache", "v_cache"), replayed, expected, strict=True):
        assert torch.equal(got, want), f"{name} differs from the call's own path"


def test_a_planned_decode_step_still_refuses_bad_input(replays):
    """A step of another signature records its own plan, through the checks: bad input raises, it is never replayed
    from a good step's plan."""
    inputs = _decode_step_inputs(2, 2048, 256, seed=13)
    for _ in range(2):
        _decode_step(inputs)
    with pytest.raises(TypeError, match="block_table must be int32"):
        _decode_step(dict(inputs, block_table=inputs["block_table"].long()))
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        _decode_step(dict(inputs, cache_seqlens=inputs["cache_seqlens"].long()))
    with pytest.raises(ValueError, match=r"k must have shape \(batch="):
        _decode_step(dict(inputs, k=inputs["k"][:, :, :4], v=inputs["v"][:, :, :4]))
    assert len(replays) == 1
