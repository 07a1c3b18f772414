"""flashattn under torch.compile, and without Triton installed.

The custom ops carry fake implementations, so a compiled graph sees through them: fullgraph compiles,
gives eager's results, and dynamic shapes do not recompile for each sequence length.
"""

import os
import subprocess
import sys
import textwrap

import torch
from cases import COMPILE_BACKEND

import flashattn
from flashattn import flash_attn_func


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
