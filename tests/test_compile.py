"""flashattn under torch.compile, and without Triton installed.

The custom ops carry fake implementations, so a compiled graph sees through them: fullgraph compiles,
gives eager's results, and dynamic shapes do not recompile for each sequence length.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from cases import COMPILE_BACKEND

import flashattn
from flashattn import flash_attn_func, fp8


def _compile_counter():
    """A fresh dynamo state and a counter of its compiles. Imported here: torch._dynamo takes seconds to import, and
    every pytest-xdist worker collects this module."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    return CompileCounterWithBackend(COMPILE_BACKEND)


def _loss(q, k, v):
    return (flash_attn_func(q, k, v, causal=True, window_size=(7, -1)) ** 2).sum()


def test_fullgraph_compile_matches_eager_and_does_not_recompile_per_seqlen(torch_backend):
    counter = _compile_counter()
    compiled = torch.compile(_loss, fullgraph=True, dynamic=True, backend=counter)
    compiles_after_first = None
    for seqlen in (37, 53, 70):
        leaves = [torch.randn(2, seqlen, 4, 32, requires_grad=True) for _ in range(3)]
        eager_leaves = [x.detach().clone().requires_grad_() for x in leaves]
        compiled(*leaves).backward()
        _loss(*eager_leaves).backward()
        for a, b in zip(leaves, eager_leaves, strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
        compiles_after_first = compiles_after_first or counter.frame_count
        assert counter.frame_count == compiles_after_first, f"recompiled for seqlen {seqlen}"


def test_import_and_cpu_path_work_without_triton():
    script = textwrap.dedent("""
        import sys
        class BlockTriton:
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ImportError("triton is blocked for this test")
        sys.meta_path.insert(0, BlockTriton())
        import torch, flashattn
        q = torch.randn(1, 9, 2, 16, requires_grad=True)
        flashattn.flash_attn_func(q, q, q, causal=True).sum().backward()
        assert "triton" not in sys.modules
        print("ok", q.grad.shape)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={"PATH": "", "FLASHATTN_BACKEND": "", "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def _masked_loss(query, key, value, mask):
    out = flashattn.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=True,
                                                 enable_gqa=True)
    return (out**2).sum()


def test_fullgraph_compile_of_sdpa_with_a_float_mask_matches_eager(torch_backend):
    counter = _compile_counter()
    compiled = torch.compile(_masked_loss, fullgraph=True, backend=counter)
    leaves = [torch.randn(2, 4, 29, 32), torch.randn(2, 2, 41, 32), torch.randn(2, 2, 41, 32),
              torch.randn(1, 4, 29, 41)]
    leaves = [x.requires_grad_() for x in leaves]
    eager_leaves = [x.detach().clone().requires_grad_() for x in leaves]
    compiled(*leaves).backward()
    _masked_loss(*eager_leaves).backward()
    for a, b in zip(leaves, eager_leaves, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    assert counter.frame_count == 1


def test_custom_ops_pass_opcheck_with_a_mask(torch_backend):
    """The fake implementations agree with the real ones (shapes, strides, dtypes), mask gradient included."""
    from flashattn import ops

    q, k, v = torch.randn(2, 9, 4, 16), torch.randn(2, 13, 2, 16), torch.randn(2, 13, 2, 16)
    mask = torch.randn(1, 4, 9, 13)
    scalars = (0.25, -1, 0, 0.0, 0.0)
    out, lse = ops.attention_forward(q, k, v, None, None, *scalars, mask)
    torch.library.opcheck(ops.attention_forward, (q, k, v, None, None, *scalars, mask))
    for mask_grad in (True, False):
        torch.library.opcheck(ops.attention_backward,
                              (torch.randn_like(out), q, k, v, out, lse, None, None, *scalars, mask, mask_grad))


def _fp8_attention(q, k, v, seed):
    return fp8.flash_attn_func(q, k, v, causal=True, seed=seed, deterministic=True)


def _fp8_compiled_against_eager(device, seeds):
    """fp8.flash_attn_func's training step (the rotation drawn inside, the quantizer and both directions' ops) under
    torch.compile(fullgraph=True) against eager: the same output and gradients for each of ``seeds`` (None: the draw
    from torch's generator, repeated by torch.manual_seed)."""
    from torch._inductor import config

    counter = _compile_counter()
    compiled = torch.compile(_fp8_attention, fullgraph=True, backend=counter)
    leaves = [torch.randn(1, 150, 4, 128, device=device).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    dout = torch.randn(1, 150, 4, 128, device=device).to(torch.bfloat16)
    for seed in seeds:
        results = []
        for step in (compiled, _fp8_attention):
            torch.manual_seed(5)
            with config.patch(fallback_random=True):  # inductor's own random streams would draw other signs
                out = step(*leaves, seed)
            results.append((out, *torch.autograd.grad(out, leaves, dout)))
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert counter.frame_count == len(set(seeds))  # the seed is a constant of the graph


def test_fp8_training_compiles_whole_with_the_rotation(torch_backend):
    _fp8_compiled_against_eager("cpu", (3, None))


@pytest.mark.gpu
def test_fp8_training_compiles_whole_with_the_rotation_gpu():
    _fp8_compiled_against_eager("cuda", (3, None))


@pytest.mark.parametrize("granularity", ["block", "head"])
def test_fp8_train_forward_op_passes_opcheck(torch_backend, granularity):
    """The trainable FP8 forward's op: its fake outputs (e4m3 tensors, descales, out, lse) match the real ones, with
    the rotation and without."""
    from flashattn import ops_fp8

    q = torch.randn(2, 130, 4, 32).to(torch.bfloat16)
    k, v = (torch.randn(2, 70, 2, 32).to(torch.bfloat16) for _ in range(2))
    for signs in (fp8.random_signs(32, seed=1, device=torch.device("cpu")), None):
        torch.library.opcheck(ops_fp8.fp8_train_forward, (q, k, v, signs, 0.2, -1, 0, 0.0, granularity))


class _Exported(torch.nn.Module):
    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, *inputs):
        return self.call(*inputs)


def _exported_matches_eager(call, inputs, needs_grad) -> None:
    """``call`` exported by torch.export and run as a module: its output and the gradients of the inputs marked in
    ``needs_grad`` equal eager's bitwise (the op's own gradient formula against the autograd.Function's)."""
    program = torch.export.export(_Exported(call), tuple(inputs))
    results = []
    for step in (program.module(), call):
        leaves = [x.detach().clone().requires_grad_(grad) for x, grad in zip(inputs, needs_grad, strict=True)]
        out = step(*leaves)
        grad = torch.ones_like(out).cumsum(-1).sin()  # a fixed cotangent, not a constant one
        results.append((out, *torch.autograd.grad(out, [x for x in leaves if x.requires_grad], grad)))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_exported_programs_are_differentiable(torch_backend):
    """torch.export keeps the forward's op and drops the autograd.Function: the op's registered gradient makes the
    exported program trainable (dense with GQA and a window, an SDPA float mask's gradient, packed batches)."""
    q, k, v = torch.randn(2, 17, 4, 32), torch.randn(2, 23, 2, 32), torch.randn(2, 23, 2, 32)
    _exported_matches_eager(lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=(5, -1)), (q, k, v),
                            (True, True, True))
    mask = torch.randn(1, 4, 17, 23)
    _exported_matches_eager(
        lambda q, k, v, m: flashattn.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask), (True, True, True, True))
    cu_seqlens = torch.tensor([0, 5, 17], dtype=torch.int32)
    _exported_matches_eager(
        lambda q, k, v, cu: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True),
        (q[0], k[0, :17], v[0, :17], cu_seqlens), (True, True, True, False))


def test_exported_paged_call_refuses_a_backward(torch_backend):
    """A paged varlen call stays forward only when exported: the backward raises, as the eager call's does."""
    pages, block_table = torch.randn(4, 16, 2, 32), torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    cu_seqlens_q, cu_seqlens_k = (torch.tensor(c, dtype=torch.int32) for c in ([0, 3, 8], [0, 20, 31]))

    def call(q, k, v):
        return flashattn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, 5, 20, block_table=block_table)

    q = torch.randn(8, 4, 32)
    program = torch.export.export(_Exported(call), (q, pages, pages))
    leaf = q.clone().requires_grad_()
    out = program.module()(leaf, pages, pages)
    with pytest.raises(RuntimeError, match="forward only"):
        out.sum().backward()
