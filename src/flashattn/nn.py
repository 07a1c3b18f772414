"""Modules on flashattn's kernels: a drop-in ``MultiheadAttention`` and a compact ``SelfAttention`` block.

``MultiheadAttention`` is ``torch.nn.MultiheadAttention`` (it subclasses it: same constructor, parameters,
initialization and state_dict keys) whose ``need_weights=False`` path runs on flashattn. It defaults to
``batch_first=True``, flashattn's layout; ``need_weights=True`` needs the attention matrix, which
flashattn never builds, so those calls run torch's own computation.

``SelfAttention`` is the block a decoder uses: one fused qkv projection, optional rotary embeddings,
grouped-query attention and an output projection, on (batch, seqlen, dim) tensors; with a ``process_group`` it
runs context-parallel on this rank's shard of the sequence (``flashattn.distributed``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .distributed import ring_flash_attn_func, shard
from .interface import flash_attn_func
from .sdpa import check_arguments, scaled_dot_product_attention


def _as_keep_or_bias(mask: torch.Tensor | None, hides_where_true: bool) -> torch.Tensor | None:
    """A torch MHA mask (bool True = hidden, or float bias) in SDPA's terms (bool True = take part)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return ~mask if hides_where_true else mask


def _merge_masks(first: torch.Tensor | None, second: torch.Tensor | None, dtype: torch.dtype):
    """One SDPA mask that hides what either hides: AND of bool masks, else the sum of float biases."""
    if first is None or second is None:
        return first if second is None else second
    if first.dtype == torch.bool and second.dtype == torch.bool:
        return first & second

    def bias(mask):
        if mask.dtype != torch.bool:
            return mask.to(dtype)
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))

    return bias(first) + bias(second)


class MultiheadAttention(nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention`` with flashattn underneath; ``batch_first=True`` by default.

    Load a torch module's weights with ``load_state_dict``: the keys are the same (``in_proj_weight``,
    ``in_proj_bias``, ``out_proj.*``, or ``q/k/v_proj_weight`` when kdim/vdim differ, ``bias_k/v``).
    Masks follow torch's MHA: ``key_padding_mask`` (batch, S) and ``attn_mask`` (L, S) or
    (batch * heads, L, S), bool True = NOT attended, or float biases. ``is_causal=True`` applies a
    top-left causal mask and ignores ``attn_mask`` (torch treats it as a hint that attn_mask is
    causal); unlike torch, it may also be given without ``attn_mask``.

    ``need_weights=True`` (torch's default) returns the attention weights and therefore runs torch's
    computation: pass ``need_weights=False`` for flashattn. Inputs flashattn does not take (float64,
    head dim > 256) run torch's computation as well, with a warning.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=True, device=None, dtype=None) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim,
                         batch_first, device, dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        reason = None if need_weights else self._unsupported(query)
        if need_weights or reason is not None:
            if reason is not None:
                warnings.warn(f"flashattn.nn.MultiheadAttention: using torch's computation: {reason}",
                              stacklevel=2)
            if is_causal and attn_mask is None:  # torch needs the mask spelled out
                attn_mask = self._causal_mask(query, key)
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        batched = query.dim() == 3
        if not batched:  # (L, E) -> (1, L, E)
            query, key, value = (x.unsqueeze(0) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # (L, B, E) -> (B, L, E), views
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        out = self._flash_forward(query, key, value, key_padding_mask, attn_mask, is_causal)
        if not batched:
            return out.squeeze(0), None
        return (out if self.batch_first else out.transpose(0, 1)), None

    def _causal_mask(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """The bool top-left causal mask (True = hidden) that torch's own path needs spelled out."""
        seq_dim = 1 if self.batch_first and query.dim() == 3 else 0
        seqlen_q, seqlen_k = query.shape[seq_dim], key.shape[seq_dim]
        return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=query.device).triu(1)

    def _unsupported(self, query: torch.Tensor) -> str | None:
        probe = query.new_empty((1, self.num_heads, 1, self.head_dim))
        try:
            check_arguments(probe, probe, probe)
        except (TypeError, ValueError) as exc:
            return str(exc)
        return None

    def _project(self, query, key, value):
        """The input projections, (B, L, E) each; one matmul when query, key and value are one tensor."""
        embed_dim = self.embed_dim
        if self._qkv_same_embed_dim:
            if query is key and key is value:
                return F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
            weights = self.in_proj_weight.chunk(3)
            biases = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
            biases = (self.in_proj_bias.split(embed_dim) if self.in_proj_bias is not None else (None,) * 3)
        return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases, strict=True))

    def _flash_forward(self, query, key, value, key_padding_mask, attn_mask, is_causal):
        batch, seqlen_q, _ = query.shape
        q, k, v = self._project(query, key, value)
        keep_keys = _as_keep_or_bias(key_padding_mask, hides_where_true=True)
        if is_causal:
            attn_mask = None  # torch's hint: the causal mask is applied by the kernel instead
        if attn_mask is not None and attn_mask.dim() == 3 and attn_mask.shape[0] != 1:
            attn_mask = attn_mask.view(batch, self.num_heads, seqlen_q, -1)  # (B * H, L, S)
        attn_mask = _as_keep_or_bias(attn_mask, hides_where_true=True)
        if self.bias_k is not None:  # one more key and value, learned, that every query sees
            k = torch.cat([k, self.bias_k.expand(batch, 1, -1)], dim=1)
            v = torch.cat([v, self.bias_v.expand(batch, 1, -1)], dim=1)
            keep_keys, attn_mask = (_pad_keys(m) for m in (keep_keys, attn_mask))
        q, k, v = (x.unflatten(-1, (self.num_heads, self.head_dim)) for x in (q, k, v))  # (B, L, H, D)
        if self.add_zero_attn:  # and a zero key and value per head
            k, v = (torch.cat([x, x.new_zeros(batch, 1, self.num_heads, self.head_dim)], dim=1) for x in (k, v))
            keep_keys, attn_mask = (_pad_keys(m) for m in (keep_keys, attn_mask))
        if keep_keys is not None:
            keep_keys = keep_keys.view(batch, 1, 1, -1)
        mask = _merge_masks(attn_mask, keep_keys, q.dtype)
        dropout_p = self.dropout if self.training else 0.0
        out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                                           dropout_p, is_causal)
        return self.out_proj(out.transpose(1, 2).flatten(2))


def _pad_keys(mask: torch.Tensor | None) -> torch.Tensor | None:
    """One more key column that every query sees (True in a keep-mask, 0 in a bias)."""
    if mask is None:
        return None
    return F.pad(mask, (0, 1), value=True if mask.dtype == torch.bool else 0.0)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the rotate-half form of GPT-NeoX and Llama) for (B, L, H, D) tensors.

    Pairs (x[i], x[i + D/2]) rotate by position * base^(-2i/D). The frequencies are a buffer kept out of
    the state_dict; the angles are computed in float32 for the positions asked for.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, device=None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dim, got {head_dim}")
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        self.register_buffer("inv_freq", base**-exponents, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (B, L, H, D); positions: (L,) or (B, L) integers. Returns x rotated, in x's dtype."""
        angles = positions.to(torch.float32)[..., None] * self.inv_freq  # (..., L, D/2)
        if angles.dim() == 2:
            angles = angles[None]
        cos, sin = (f(angles)[:, :, None, :] for f in (torch.cos, torch.sin))  # (B|1, L, 1, D/2)
        first, second = x.float().chunk(2, dim=-1)
        rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
        return rotated.to(x.dtype)


class SelfAttention(nn.Module):
    """Self-attention block: fused qkv projection, rotary embeddings, GQA, output projection.

    x: (batch, seqlen, dim) -> (batch, seqlen, dim). ``num_kv_heads`` < ``num_heads`` shares each key/
    value head among ``num_heads // num_kv_heads`` query heads. ``attention_mask`` (batch, seqlen) bool
    marks real tokens (True) against padding (False), Hugging Face's convention.

    ``process_group``: context parallelism. x is then this rank's shard of the sequence, (batch, local_seqlen,
    dim), in the zigzag layout of ``flashattn.distributed.shard``; the attention runs over the whole sequence
    (``ring_flash_attn_func`` with ``context_parallel_mode``: "ring", "all_to_all" or "auto"), the rotary
    embedding at the global positions of the local tokens. The module's parameters are replicated: reduce their
    gradients over the group (a sum, with each rank's loss a part of the whole) as data parallelism does.

    ``attention``: the function the single-process path without ``attention_mask`` calls, with
    :func:`flashattn.flash_attn_func`'s signature (the default), e.g. ``flashattn.fp8.flash_attn_func`` for FP8
    attention; the masked and context-parallel paths have their own functions and refuse another.
    """

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int | None = None, *, head_dim: int | None = None,
                 causal: bool = True, rotary: bool = True, rotary_base: float = 10000.0, dropout: float = 0.0,
                 bias: bool = False, process_group=None, context_parallel_mode: str = "ring",
                 attention: Callable = flash_attn_func, device=None, dtype=None) -> None:
        super().__init__()
        if attention is not flash_attn_func and process_group is not None:
            raise ValueError("attention: a process_group runs ring_flash_attn_func, not another attention function")
        num_kv_heads = num_kv_heads or num_heads
        head_dim = head_dim or dim // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.causal, self.dropout = causal, dropout
        self.process_group, self.context_parallel_mode = process_group, context_parallel_mode
        self.attention = attention
        factory = dict(device=device, dtype=dtype)
        self.qkv = nn.Linear(dim, (num_heads + 2 * num_kv_heads) * head_dim, bias=bias, **factory)
        self.out = nn.Linear(num_heads * head_dim, dim, bias=bias, **factory)
        self.rotary = RotaryEmbedding(head_dim, rotary_base, device=device) if rotary else None

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, seqlen: int | None = None) -> torch.Tensor:
        """``positions``: (seqlen,) or (batch, seqlen) token positions for the rotary embedding (default
        0..seqlen-1; with a process group, the global positions of the local tokens). ``seqlen``: with a process
        group, the whole sequence's length (default: the group's size x the local length)."""
        batch, local_seqlen, _ = x.shape
        parallel = self.process_group is not None
        if parallel and attention_mask is not None:
            raise ValueError("attention_mask is not taken with a process_group: pack the sequences instead")
        if not parallel and seqlen is not None:
            raise ValueError("seqlen is the whole length of a sharded sequence: it needs a process_group")
        if attention_mask is not None and self.attention is not flash_attn_func:
            raise ValueError("attention_mask runs scaled_dot_product_attention, not the module's attention function")
        sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                 self.num_kv_heads * self.head_dim)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in self.qkv(x).split(sizes, dim=-1))  # (B, L, H, D)
        if self.rotary is not None:
            if positions is None and parallel:
                full = seqlen if seqlen is not None else local_seqlen * dist.get_world_size(self.process_group)
                positions = shard(torch.arange(full, device=x.device), self.process_group, dim=0)
            elif positions is None:
                positions = torch.arange(local_seqlen, device=x.device)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        dropout_p = self.dropout if self.training else 0.0
        if parallel:
            out = ring_flash_attn_func(q, k, v, self.process_group, self.causal, dropout_p=dropout_p, seqlen=seqlen,
                                       mode=self.context_parallel_mode)
        elif attention_mask is None:
            out = self.attention(q, k, v, dropout_p, causal=self.causal)
        else:
            keep = attention_mask.to(torch.bool).view(batch, 1, 1, local_seqlen)
            out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keep,
                                               dropout_p, self.causal, enable_gqa=True).transpose(1, 2)
        return self.out(out.flatten(2))
