"""Two plain-PyTorch attentions: the test oracle, and the seed documents' block algorithm.

``attention_ref`` materializes the full score matrix and supports every option; in float64 it is the
oracle the kernels are held to, and in the input dtype (``upcast=False``) it is the "plain PyTorch"
whose error sets the tolerance. ``seed_block_attention`` is the tiled algorithm exactly as the seeds
teach it (a loop over key/value blocks carrying a running max and sum), kept readable on purpose.
"""

from __future__ import annotations

import math

import torch

from . import masks
from .dropout import StreamFrame, keep_mask


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    upcast: bool = True,
    dropout_frame: StreamFrame | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Materializing attention. q: (B, Sq, Hq, D), k/v: (B, Sk, Hk, D). Returns (out, lse).

    ``attn_mask``: an SDPA mask broadcastable to (B, Hq, Sq, Sk); bool True = take part, float is
    added to the scores (after the softcap). A float mask that requires grad gets its gradient.
    ``upcast=True`` computes in float64 and returns float64; otherwise it computes in q's dtype.
    Rows that see no key give out = 0 and lse = +inf, as the kernels do. ``dropout_frame`` places a
    single sequence of a varlen batch in the packed dropout stream (see ``dropout.py``).
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    dtype = torch.float64 if upcast else q.dtype
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    group = nheads // nheads_k
    qh = q.to(dtype).transpose(1, 2)  # (B, Hq, Sq, D)
    kh = k.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    vh = v.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)

    scores = (qh @ kh.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(seqlen_q, device=q.device).view(-1, 1)
    cols = torch.arange(seqlen_k, device=q.device).view(1, -1)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(dtype).expand(batch, nheads) if alibi_slopes.dim() == 1 else alibi_slopes
        dist = masks.alibi_distance(rows, cols, seqlen_q, seqlen_k).to(dtype)
        scores = scores - slopes.to(dtype).view(batch, nheads, 1, 1) * dist
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(dtype)
    left, right = window_size
    if causal:
        right = 0
    seen = masks.visible(rows, cols, seqlen_q, seqlen_k, left, right)
    scores = scores.masked_fill(~seen, float("-inf"))

    # rows that see no key: computed as if unmasked and then zeroed, so that neither the forward nor the
    # backward meets -inf - (-inf) (an additive -inf mask would otherwise carry NaN into the gradients)
    empty = (scores == float("-inf")).all(dim=-1, keepdim=True)
    scores = scores.masked_fill(empty, 0.0)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).masked_fill(empty, 0.0)
    if dropout_p > 0:
        assert rng_state is not None, "dropout needs the rng_state the kernel used"
        keep = keep_mask(rng_state, dropout_p, batch, nheads, rows.view(-1), cols.view(-1), seqlen_q, seqlen_k,
                         frame=dropout_frame)
        probs = probs.masked_fill(~keep.to(q.device), 0.0) / (1.0 - dropout_p)
    out = (probs @ vh).transpose(1, 2)
    lse = lse.masked_fill(empty.squeeze(-1), float("inf"))
    return out, lse


def varlen_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    upcast: bool = True,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention_ref` on each sequence of a packed (varlen) batch, concatenated.

    q: (total_q, Hq, D), k/v: (total_k, Hk, D), cu_seqlens: (batch + 1,). Returns out of q's shape and
    lse of shape (Hq, total_q), the varlen layout. Masks are aligned per sequence; ALiBi slopes of shape
    (batch, Hq) give each sequence its row; dropout takes the packed stream.
    """
    total_q, nheads = q.shape[:2]
    total_k = k.shape[0]
    dtype = torch.float64 if upcast else q.dtype
    outs, lses = [], []
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(bounds_q) - 1):
        (q_start, q_end), (k_start, k_end) = bounds_q[b : b + 2], bounds_k[b : b + 2]
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.dim() == 2:
            slopes = alibi_slopes[b : b + 1]
        frame = StreamFrame(q_start, k_start, total_q, total_k)
        out, lse = attention_ref(
            q[None, q_start:q_end], k[None, k_start:k_end], v[None, k_start:k_end], alibi_slopes=slopes,
            dropout_p=dropout_p, rng_state=rng_state, upcast=upcast, dropout_frame=frame, **options,
        )
        outs.append(out[0].to(dtype))
        lses.append(lse[0])
    if not outs:
        return q.new_zeros(q.shape, dtype=dtype), q.new_zeros((nheads, 0), dtype=dtype)
    return torch.cat(outs), torch.cat(lses, dim=1)


def seed_block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, causal: bool = False
) -> torch.Tensor:
    """The seeds' block algorithm, for one layout (B, S, H, D) and equal q/k lengths: teaching code.

    For each block of queries, walk the key/value blocks and keep three running quantities per row:
    the max score seen so far (m), the sum of exponentials relative to it (l), and the unnormalized
    output (acc). When a new block raises the max, the old sum and output are rescaled by
    exp(m_old - m_new); dividing by l at the end gives exactly softmax(S) V.
    """
    seqlen, head_dim = q.shape[1], q.shape[3]
    scale = 1.0 / math.sqrt(head_dim)
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))  # (B, H, S, D)
    out = torch.empty_like(qh)
    for i in range(0, seqlen, block_size):
        q_block = qh[:, :, i : i + block_size]
        m = torch.full(q_block.shape[:-1] + (1,), float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_block)
        for j in range(0, seqlen, block_size):
            if causal and j > i + block_size - 1:
                break  # every key of this block lies in the future of every query
            s = q_block @ kh[:, :, j : j + block_size].transpose(-1, -2) * scale
            if causal:
                rows = torch.arange(i, i + s.shape[-2]).view(-1, 1)
                cols = torch.arange(j, j + s.shape[-1]).view(1, -1)
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            correction = torch.exp(m - m_new)
            l = l * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + p @ vh[:, :, j : j + block_size]
            m = m_new
        out[:, :, i : i + block_size] = acc / l
    return out.transpose(1, 2).to(q.dtype)
