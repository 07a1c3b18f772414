"""The public API: packed forms, strided inputs, dropout, determinism, masked rows, bad input.

Each test runs on both backends: the torch path, and the Triton kernels (interpreter without a GPU).
"""

import math
import subprocess
import sys

import pytest
import torch
from cases import deterministic_algorithms

from flashattn import configs, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn.launch import backward as launch_backward
from flashattn.launch import common
from flashattn.options import AttentionOptions, new_rng_state
from flashattn.reference import attention_ref
from flashattn.testing import Case, check_against_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_qkvpacked_matches_unpacked(backend):
    qkv = torch.randn(2, 45, 3, 4, 32, device=DEVICE, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = qkv.detach().unbind(dim=2)
    expected, _ = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()


def test_kvpacked_matches_unpacked_with_gqa(backend):
    q = torch.randn(1, 19, 6, 48, device=DEVICE)
    kv = torch.randn(1, 31, 2, 2, 48, device=DEVICE)
    out = flash_attn_kvpacked_func(q, kv, window_size=(4, 2))
    expected, _ = attention_ref(q, kv[:, :, 0], kv[:, :, 1], window_size=(4, 2))
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


def test_any_negative_window_side_is_unbounded_as_in_flash_attn(torch_backend):
    q, k, v = (torch.randn(1, n, 2, 16, device=DEVICE) for n in (9, 13, 13))
    for given, same in (((-7, 3), (-1, 3)), ((2, -2**63), (2, -1)), ((-5, 0), (-1, 0))):
        torch.testing.assert_close(flash_attn_func(q, k, v, window_size=given),
                                   flash_attn_func(q, k, v, window_size=same), rtol=0, atol=0)
    options = AttentionOptions.build(16, None, False, (-9, -3), 0.0, 0.0, False)
    assert (options.window_left, options.window_right, options.masked) == (-1, -1, False)


def test_torch_deterministic_switch_asks_for_a_repeatable_backward():
    """A call's backward is bitwise repeatable with ``deterministic=True`` or under
    ``torch.use_deterministic_algorithms(True)``, read when the backward runs (an exported program keeps no
    ``deterministic`` of its own); the launcher's choice (the fused sm90 kernel or two passes) follows it on the GPU."""
    options = AttentionOptions.build(16, None, True, (-1, -1), 0.0, 0.0, False)
    assert not options.repeatable
    with deterministic_algorithms():
        assert options.repeatable
    assert not options.repeatable
    assert AttentionOptions.build(16, None, True, (-1, -1), 0.0, 0.0, True).repeatable


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(5, 0), (0, 7), (0, 0)])
def test_a_call_without_queries_or_keys_is_empty_as_in_flash_attn(seqlen_q, seqlen_k):
    """No kernel runs: out zeros (no key to attend to), the log-sum-exp +inf, zero gradients of the inputs' shapes."""
    q = torch.randn(2, seqlen_q, 4, 16, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, seqlen_k, 2, 16, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in "kv")
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, seqlen_q, 4, 16) and out.dtype == q.dtype and not out.any()
    assert lse.shape == (2, 4, seqlen_q) and lse.dtype == torch.float32 and (lse == math.inf).all()
    out.float().sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and not x.grad.any()


def test_strided_inputs_are_read_in_place(backend):
    # (B, H, S, D) storage viewed as (B, S, H, D): the last dim is contiguous, the rest are not
    q, k, v = (torch.randn(2, 3, n, 40, device=DEVICE).transpose(1, 2) for n in (50, 70, 70))
    assert not q.is_contiguous()
    case = Case(2, 50, 70, 3, 3, 40, {"causal": True})
    check_against_reference(case, torch.float32, DEVICE, flash_attn_func, inputs=(q, k, v))


def test_fully_masked_rows_give_zero_and_finite_gradients(backend):
    q = torch.randn(1, 40, 2, 16, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(1, 10, 2, 16, device=DEVICE, requires_grad=True) for _ in range(2))
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out[:, :30], torch.zeros_like(out[:, :30]))
    assert torch.isinf(lse[..., :30]).all() and torch.isfinite(lse[..., 30:]).all()
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert torch.equal(q.grad[:, :30], torch.zeros_like(q.grad[:, :30]))


def _grads(q, k, v, **options):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = flash_attn_func(*leaves, **options)
    out.backward(torch.ones_like(out))
    return [x.grad for x in leaves]


def test_deterministic_backward_is_bitwise_repeatable(backend):
    if backend == "triton" and DEVICE == "cpu":
        pytest.skip("the interpreter runs one program at a time: only the GPU's schedule could make a repeat differ")
    q, k, v = (torch.randn(2, 67, 4, 32, device=DEVICE) for _ in range(3))
    first = _grads(q, k, v, causal=True, deterministic=True)
    second = _grads(q, k, v, causal=True, deterministic=True)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_dropout_reproducible_and_seeded(backend):
    q, k, v = (torch.randn(1, 33, 2, 16, device=DEVICE) for _ in range(3))
    torch.manual_seed(7)
    first = flash_attn_func(q, k, v, dropout_p=0.4)
    torch.manual_seed(7)
    second = flash_attn_func(q, k, v, dropout_p=0.4)
    third = flash_attn_func(q, k, v, dropout_p=0.4)
    assert torch.equal(first, second)
    assert not torch.equal(first, third)


def test_dropout_zero_is_no_dropout(backend):
    q, k, v = (torch.randn(1, 33, 2, 16, device=DEVICE) for _ in range(3))
    assert torch.equal(flash_attn_func(q, k, v, dropout_p=0.0), flash_attn_func(q, k, v))


def test_dropout_mean_over_seeds_approaches_no_dropout(backend):
    q, k, v = (torch.randn(1, 24, 1, 16, device=DEVICE) for _ in range(3))
    expected = flash_attn_func(q, k, v)
    draws = 300 if backend == "torch" or DEVICE == "cuda" else 20  # an interpreted call costs a tenth of a second
    mean = sum(flash_attn_func(q, k, v, dropout_p=0.25) for _ in range(draws)) / draws
    # each element is a mean of independent draws: its error shrinks as 1/sqrt(draws)
    spread = (mean - expected).abs().mean().item()
    single = (flash_attn_func(q, k, v, dropout_p=0.25) - expected).abs().mean().item()
    assert spread < 2.5 * single / draws**0.5


def test_dropout_backward_regenerates_the_mask(backend):
    case = Case(2, 29, 41, 2, 1, 24, {"dropout_p": 0.3, "causal": True})
    check_against_reference(case, torch.float32, DEVICE, flash_attn_func)


BAD_INPUTS = [
    ("rank", lambda q, k, v: (q[0], k, v), {}, ValueError, "q must have 4 dimensions"),
    ("dtype", lambda q, k, v: (q.double(), k.double(), v.double()), {}, TypeError, "float16, bfloat16"),
    ("dtype-mismatch", lambda q, k, v: (q, k.half(), v.half()), {}, TypeError, "k must have q's dtype"),
    ("head-dim", lambda q, k, v: (q, k[..., :8], v[..., :8]), {}, ValueError, "head dim"),
    ("heads", lambda q, k, v: (q, *torch.randn(2, 2, 8, 3, 16)), {}, ValueError, "multiple of the number"),
    ("kv-shape", lambda q, k, v: (q, k, v[:, :5]), {}, ValueError, "k and v must have the same shape"),
    ("batch", lambda q, k, v: (q, k[:1], v[:1]), {}, ValueError, "batch size"),
    ("dropout", lambda q, k, v: (q, k, v), {"dropout_p": 1.0}, ValueError, "dropout_p"),
    ("window", lambda q, k, v: (q, k, v), {"window_size": (-2**63 - 1, 0)}, ValueError, "window_size"),
    ("softcap", lambda q, k, v: (q, k, v), {"softcap": -1.0}, ValueError, "softcap"),
    ("alibi-shape", lambda q, k, v: (q, k, v), {"alibi_slopes": torch.ones(3)}, ValueError, "alibi_slopes"),
    ("alibi-dtype", lambda q, k, v: (q, k, v), {"alibi_slopes": torch.ones(4, dtype=torch.float64)},
     TypeError, "alibi_slopes must be float32"),
    ("not-a-tensor", lambda q, k, v: (q.tolist(), k, v), {}, TypeError, "q must be a torch.Tensor"),
    ("head-dim-too-big", lambda q, k, v: (torch.randn(2, 8, 4, 300),) * 3, {}, ValueError, "between 1 and 256"),
    ("window-int", lambda q, k, v: (q, k, v), {"window_size": 5}, TypeError, "window_size must be a pair"),
    ("window-none", lambda q, k, v: (q, k, v), {"window_size": None}, TypeError, "window_size must be a pair"),
    ("window-float", lambda q, k, v: (q, k, v), {"window_size": (2.5, 0)}, TypeError, "window_size must be a pair"),
    ("window-nan", lambda q, k, v: (q, k, v), {"window_size": (math.nan, 0)}, TypeError, "window_size must be a pair"),
    ("window-huge", lambda q, k, v: (q, k, v), {"window_size": (2**63, 0)}, ValueError, "window_size must be a pair"),
    ("scale-str", lambda q, k, v: (q, k, v), {"softmax_scale": "a"}, TypeError, "softmax_scale must be a finite"),
    ("scale-nan", lambda q, k, v: (q, k, v), {"softmax_scale": float("nan")}, ValueError, "softmax_scale must be"),
    ("scale-inf", lambda q, k, v: (q, k, v), {"softmax_scale": float("-inf")}, ValueError, "softmax_scale must be"),
    ("scale-past-float32", lambda q, k, v: (q, k, v), {"softmax_scale": 1e39}, ValueError, r"float \(in float32"),
    ("softcap-nan", lambda q, k, v: (q, k, v), {"softcap": float("nan")}, ValueError, "softcap must be a finite"),
    ("softcap-inf", lambda q, k, v: (q, k, v), {"softcap": float("inf")}, ValueError, "softcap must be a finite"),
    ("softcap-str", lambda q, k, v: (q, k, v), {"softcap": "1"}, TypeError, "softcap must be a float"),
    ("transposed", lambda q, k, v: (torch.randn(2, 4, 8, 16), torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)),
     {}, ValueError, r"if q, k and v are \(batch, nheads, seqlen, headdim\).*transpose\(1, 2\)"),
]


@pytest.mark.parametrize("name,transform,options,error,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_error(name, transform, options, error, message):
    q, k, v = torch.randn(2, 8, 4, 16), torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16)
    with pytest.raises(error, match=message):
        flash_attn_func(*transform(q, k, v), **options)


def test_bad_scales_are_refused_everywhere():
    """NaN or infinite scales would turn every output to NaN: refused by every entry point, naming the argument."""
    from flashattn import flash_attn_varlen_func, flash_attn_with_kvcache, scaled_dot_product_attention

    q, k = torch.randn(2, 8, 4, 16), torch.randn(2, 8, 2, 16)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match="softmax_scale must be"):
        flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), k.flatten(0, 1), cu, cu, 8, 8,
                               softmax_scale=float("nan"))
    with pytest.raises(ValueError, match="softmax_scale must be"):
        flash_attn_with_kvcache(q[:, :1], k, k, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match="softcap must be"):
        flash_attn_with_kvcache(q[:, :1], k, k, softcap=float("nan"))
    with pytest.raises(ValueError, match="scale must be"):
        scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), scale=float("nan"))


def test_packed_forms_check_their_layout():
    with pytest.raises(ValueError, match="qkv must have shape"):
        flash_attn_qkvpacked_func(torch.randn(1, 4, 2, 2, 8))
    with pytest.raises(ValueError, match="kv must have shape"):
        flash_attn_kvpacked_func(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 3, 2, 8))


def test_backend_override_must_be_known(monkeypatch):
    monkeypatch.setenv("FLASHATTN_BACKEND", "cuda-please")
    with pytest.raises(ValueError, match="FLASHATTN_BACKEND"):
        flash_attn_func(*(torch.randn(1, 4, 2, 8) for _ in range(3)))


def test_triton_backend_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    """Compiled for a GPU, a kernel would get host pointers: refused with what to change, for every entry."""
    from flashattn import flash_attn_combine, flash_attn_varlen_func, flash_attn_with_kvcache

    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = (torch.randn(1, 4, 2, 8) for _ in range(3))
    cu_seqlens = torch.tensor([0, 4], dtype=torch.int32)
    calls = [lambda: flash_attn_func(q, k, v),
             lambda: flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens, cu_seqlens, 4, 4),
             lambda: flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=torch.tensor([2], dtype=torch.int32)),
             lambda: flash_attn_combine(torch.randn(2, 1, 4, 2, 8), torch.randn(2, 1, 2, 4))]
    for call in calls:
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            call()


@pytest.mark.gpu
def test_device_mismatch_is_refused():
    q = torch.randn(1, 8, 2, 16, device="cuda")
    with pytest.raises(ValueError, match="k must be on q's device"):
        flash_attn_func(q, q.cpu(), q.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_direct_eager_calls_match_the_registered_ops_bitwise(monkeypatch, varlen):
    # eager CUDA calls skip the custom-op layer (ops.eager_call); through it they must give the same bits
    from flashattn import flash_attn_varlen_func, ops

    q, k, v = (torch.randn(2, 77, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 77, 154], device="cuda", dtype=torch.int32)

    def grads():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        if varlen:
            out = flash_attn_varlen_func(*(x.flatten(0, 1) for x in leaves), cu, cu, 77, 77, causal=True,
                                         deterministic=True)
        else:
            out = flash_attn_func(*leaves, causal=True, deterministic=True)
        out.float().square().sum().backward()
        return [out, *(x.grad for x in leaves)]

    direct = grads()
    monkeypatch.setattr(ops, "eager_call", lambda op, cuda_impl, *args: op(*args))
    registered = grads()
    for a, b in zip(direct, registered, strict=True):
        assert torch.equal(a, b)


def test_eager_call_takes_the_registered_op_for_cpu_tensors():
    from flashattn import ops

    calls = []
    op, cuda_impl = (lambda *args: calls.append("op")), (lambda *args: calls.append("cuda"))
    ops.eager_call(op, cuda_impl, torch.zeros(1))
    with torch.no_grad():
        ops.eager_call(op, cuda_impl, torch.zeros(1))
    assert calls == ["op", "op"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_eager_call_goes_direct_with_grad_mode_on_unless_an_input_requires_grad():
    from flashattn import ops

    calls = []
    op, cuda_impl = (lambda *args: calls.append("op")), (lambda *args: calls.append("cuda"))
    x = torch.zeros(1, device="cuda")
    ops.eager_call(op, cuda_impl, x, None, 1.0)  # a decode step: grad mode on, nothing requires grad
    ops.eager_call(op, cuda_impl, x, x.clone().requires_grad_())  # the op must refuse a backward
    ops.eager_call(op, cuda_impl, x, torch.nn.Parameter(x.clone()))  # a subclass that requires grad, too
    with torch.no_grad():
        ops.eager_call(op, cuda_impl, x, x.clone().requires_grad_())
    assert calls == ["cuda", "op", "op", "cuda"]


def _gradients(q, k, v, dout, **options):
    from flashattn import flash_attn_func

    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash_attn_func(*leaves, **options)
    return torch.autograd.grad(out, leaves, dout)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, seqlen, causal", [(64, 1023, False), (128, 2048, True), (256, 113, False)],
                         ids=["hdim64-triton-dq", "hdim128-hopper-dq", "hdim256-short"])
def test_concurrent_gradient_kernels_match_the_serial_order_bitwise(monkeypatch, head_dim, seqlen, causal):
    """The dQ kernel on a second stream beside the dK/dV kernel (``GradientStreams``) computes what the two
    kernels compute one after the other: neither kernel reads the other's output, and neither uses atomics
    (deterministic: the two passes, where hdim 128 would fuse dQ into the dK/dV kernel)."""

    joins = _count_gradient_stream_joins(monkeypatch)
    q, k, v, dout = (torch.randn(2, seqlen, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    concurrent = _gradients(q, k, v, dout, causal=causal, deterministic=True)
    assert joins == [1]  # these shapes are below the FLOP rule, which the fixture lifts
    monkeypatch.setattr(launch_backward, "_gradient_streams_pay", lambda *args: False)
    serial = _gradients(q, k, v, dout, causal=causal, deterministic=True)
    for a, b in zip(concurrent, serial, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_concurrent_gradient_kernels_replay_from_a_cuda_graph(monkeypatch):
    """The backward's fork onto the second stream and its join are captured into a CUDA graph, and a replay
    over new inputs gives the eager gradients of those inputs."""
    joins = _count_gradient_stream_joins(monkeypatch)
    q, k, v, dout = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    static = [x.clone() for x in (q, k, v, dout)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the capture: compiles, allocations
        _gradients(*static, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _gradients(*static, causal=True)
    fresh = [torch.randn_like(x) for x in static]
    for target, source in zip(static, fresh, strict=True):
        target.copy_(source)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, _gradients(*fresh, causal=True), strict=True):
        assert torch.equal(a, b)
    assert joins[0] == 3  # warm-up, capture, eager


def test_dropout_is_refused_while_a_cuda_stream_captures(monkeypatch):
    """The dropout seed is a launch argument drawn on the host: a captured call would replay one mask forever, so
    drawing it while the stream captures raises, naming dropout_p; a CPU call, or one without capture, draws."""
    if torch.cuda.is_available():
        assert new_rng_state(torch.device("cuda")).shape == (2,)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="dropout_p > 0 cannot be captured in a CUDA graph"):
        new_rng_state(torch.device("cuda"))
    assert new_rng_state(torch.device("cpu")).dtype == torch.int64


@pytest.mark.gpu
def test_dropout_call_in_a_cuda_graph_capture_raises_before_launching():
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    flash_attn_func(q, q, q, dropout_p=0.1)  # warm up off the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="dropout_p"), torch.cuda.graph(graph):
        flash_attn_func(q, q, q, dropout_p=0.1)


def _count_gradient_stream_joins(monkeypatch) -> list[int]:
    """Use the two gradient streams at any size, and count the backward calls that joined them."""

    monkeypatch.setattr(configs, "CONCURRENT_GRADIENTS_MIN_FLOPS", 0)
    joins = [0]
    original = launch_backward.GradientStreams.join

    def join(self):
        joins[0] += 1
        original(self)

    monkeypatch.setattr(launch_backward.GradientStreams, "join", join)
    return joins


def test_gradient_streams_are_kept_for_long_calls():
    """The FLOP rule: the bench's hdim-64 backward at 2k tokens (batch 8, 32 heads: 6.9e11 FLOPs) takes the two
    streams, the causal one at 512 tokens (batch 32: 8.6e10) does not; CPU tensors never do."""
    from flashattn import flops as convention

    def flops(batch, seqlen, causal):
        return convention.backward_flops(batch, seqlen, seqlen, 32, 64, causal)

    assert flops(8, 2048, False) >= configs.CONCURRENT_GRADIENTS_MIN_FLOPS > flops(32, 512, True)
    q = torch.empty(8, 2048, 32, 64, dtype=torch.bfloat16)
    layout = common.Layout.of(q, q, None)
    full = AttentionOptions(1.0, -1, -1, 0.0, 0.0)
    assert not launch_backward._gradient_streams_pay(q, layout, 32, full)  # a CPU tensor


SUBMODULES_AFTER_IMPORT = """
import sys
import flashattn
flashattn.nn.MultiheadAttention, flashattn.nn.SelfAttention, flashattn.nn.RotaryEmbedding
flashattn.integrations
assert "transformers" not in sys.modules, "import flashattn must not import transformers"
"""


def test_submodules_are_reachable_after_import_flashattn():
    """``import flashattn`` alone gives ``flashattn.nn`` and ``flashattn.integrations`` (a fresh interpreter), and
    imports no transformers (``flashattn.integrations.transformers`` does when it is first used:
    tests/test_transformers.py)."""
    result = subprocess.run([sys.executable, "-c", SUBMODULES_AFTER_IMPORT], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
