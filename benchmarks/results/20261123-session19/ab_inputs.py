"""The inputs the session's kernel-only dK/dV timings share: a backward on the bench grid's shapes (16k tokens,
heads x hdim = 2048, bf16, no GQA), with lse from SDPA's flash forward and delta = rowsum(dO * O)."""
import torch

from flashattn.options import AttentionOptions


def backward_inputs(head_dim: int, seqlen: int, causal: bool):
    """(batch, heads, q, k, v, dout, scale, lse, delta, opts) for one case, from seed 0."""
    heads, batch = 2048 // head_dim, 16384 // seqlen
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    scale = head_dim ** -0.5
    out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale)
    delta = (dout.float() * out.transpose(1, 2).float()).sum(-1).transpose(1, 2).contiguous()
    opts = AttentionOptions(scale, window_right=0 if causal else -1)
    return batch, heads, q, k, v, dout, scale, lse.contiguous(), delta, opts
