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

import numbers
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .distributed import ring_flash_attn_func, shard_positions
from .head_parallel import MODES
from .interface import flash_attn_func
from .sdpa import check_arguments, scaled_dot_product_attention


def _sizes_text(sizes: tuple) -> str:
    """(2, *, 8): sizes as the messages spell them, * for any."""
    return "(" + ", ".join("*" if s is None else str(s) for s in sizes) + ("," if len(sizes) == 1 else "") + ")"


def _check_shape(name: str, x, shapes: dict[str, tuple], device: torch.device | None = None) -> None:
    """``x`` a tensor of one of ``shapes`` ({layout: sizes}, None for any size) on ``device``, or raise naming it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not any(x.dim() == len(sizes) and all(s in (None, n) for s, n in zip(sizes, x.shape, strict=True))
               for sizes in shapes.values()):
        wanted = " or ".join(f"{layout} = {_sizes_text(sizes)}" for layout, sizes in shapes.items())
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device}, got {x.device}")


def _check_like_module(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """``x`` on the module's device, in its parameters' dtype unless autocast casts it for the projections."""
    if x.device != weight.device:
        raise ValueError(f"{name} must be on the module's device {weight.device}, got {x.device}")
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name} must have the module's parameter dtype {weight.dtype} (or run under torch.autocast), "
                        f"got {x.dtype}")


def _check_count(name: str, value, optional: bool = False) -> None:
    """A positive int (or None where ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1{' or None' if optional else ''}, got {value!r}")


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
    (batch * heads, L, S), bool True = NOT attended, or float biases (float32 or the query's dtype);
    unbatched (L, E) inputs take (S,) and (L, S) or (heads, L, S). ``is_causal=True`` applies a
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
        self._check_inputs(query, key, value, key_padding_mask, attn_mask)
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

    def _check_inputs(self, query, key, value, key_padding_mask, attn_mask) -> None:
        """The shapes, dtypes and devices torch's module takes (and the docstring lists), whichever path runs."""
        dims = "batch, seqlen" if self.batch_first else "seqlen, batch"
        _check_shape("query", query, {f"({dims}, embed_dim)": (None, None, self.embed_dim),
                                      "(seqlen, embed_dim)": (None, self.embed_dim)})
        batched = query.dim() == 3
        seq_dim = 1 if batched and self.batch_first else 0
        batch = query.shape[1 - seq_dim] if batched else 1

        def like_query(seqlen, size):  # sizes in query's layout, with query's batch
            if not batched:
                return (seqlen, size)
            return (batch, seqlen, size) if self.batch_first else (seqlen, batch, size)

        layout = f"({dims}, {{}})" if batched else "(seqlen, {})"
        _check_shape("key", key, {layout.format("kdim"): like_query(None, self.kdim)})
        _check_shape("value", value, {layout.format("vdim"): like_query(key.shape[seq_dim], self.vdim)})
        for name, x in (("query", query), ("key", key), ("value", value)):
            _check_like_module(name, x, self.out_proj.weight)
        seqlen_q, seqlen_k = query.shape[seq_dim], key.shape[seq_dim]
        autocast = torch.is_autocast_enabled(query.device.type)
        dtype = torch.get_autocast_dtype(query.device.type) if autocast else query.dtype  # the projections'
        masks = (("key_padding_mask", key_padding_mask, {"(batch, S)": (batch, seqlen_k)} if batched
                  else {"(S,)": (seqlen_k,)}),
                 ("attn_mask", attn_mask, {"(L, S)": (seqlen_q, seqlen_k),
                                           "(batch * num_heads, L, S)": (batch * self.num_heads, seqlen_q, seqlen_k)}))
        for name, mask, shapes in masks:
            if mask is None:
                continue
            _check_shape(name, mask, shapes, query.device)
            if mask.dtype not in (torch.bool, torch.float32, dtype):
                raise TypeError(f"{name} must be bool (True = not attended) or a float bias, float32 or the "
                                f"query's dtype {dtype}, got {mask.dtype}")

    def _causal_mask(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """The bool top-left causal mask (True = hidden) that torch's own path needs spelled out."""
        seq_dim = 1 if self.batch_first and query.dim() == 3 else 0
        return _hidden_above_diagonal(query.shape[seq_dim], key.shape[seq_dim], query.device)

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
            # torch's hint: attn_mask is the causal mask, which the kernels apply instead; with a learned or zero
            # key appended past the given ones, that key is seen by every query (as attn_mask padded by a visible
            # column, torch's path with a key_padding_mask or weights), so the mask is spelled out over the rest
            attn_mask = None
            if self.bias_k is not None or self.add_zero_attn:
                attn_mask = _hidden_above_diagonal(seqlen_q, key.shape[1], query.device)
                is_causal = False
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.view(batch, self.num_heads, seqlen_q, -1)  # (B * H, L, S), checked
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


def _hidden_above_diagonal(seqlen_q: int, seqlen_k: int, device) -> torch.Tensor:
    """torch's top-left causal mask as MultiheadAttention takes it: bool (L, S), True = hidden."""
    return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).triu(1)


def _pad_keys(mask: torch.Tensor | None) -> torch.Tensor | None:
    """One more key column that every query sees (True in a keep-mask, 0 in a bias)."""
    if mask is None:
        return None
    return F.pad(mask, (0, 1), value=True if mask.dtype == torch.bool else 0.0)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the rotate-half form of GPT-NeoX and Llama) for (B, L, H, D) tensors.

    Pairs (x[i], x[i + D/2]) rotate by position * base^(-2i/D). The frequencies are a buffer kept out of
    the state_dict, and stay float32 when the module is cast (``.to(torch.bfloat16)``, ``.half()``): the
    angles are computed in float32 for the positions asked for.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, device=None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dim, got {head_dim}")
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        self.register_buffer("inv_freq", base**-exponents, persistent=False)

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) casts every floating buffer: frequencies in bfloat16 turn position 4096's angles by
        # whole radians. The buffer follows the module's device, and keeps its float32 values.
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (B, L, H, D); positions: (L,), (B, L) or (1, L) integers. Returns x rotated, in x's dtype."""
        _check_shape("x", x, {"(batch, seqlen, heads, head_dim)": (None, None, None, 2 * self.inv_freq.numel())})
        batch, seqlen = x.shape[:2]
        _check_shape("positions", positions, {"(seqlen,)": (seqlen,), "(batch, seqlen)": (batch, seqlen),
                                              "(1, seqlen)": (1, seqlen)}, x.device)
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
    value head among ``num_heads // num_kv_heads`` query heads (None: ``num_heads``); ``head_dim`` defaults to
    ``dim // num_heads``. ``attention_mask`` (batch, seqlen), bool or integer, marks real tokens (True, 1) against
    padding (False, 0), Hugging Face's convention.

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
        for name, value in (("dim", dim), ("num_heads", num_heads)):
            _check_count(name, value)
        for name, value in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            _check_count(name, value, optional=True)
        if head_dim is None and dim % num_heads:
            raise ValueError(f"dim ({dim}) must be a multiple of num_heads ({num_heads}), or pass head_dim")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        head_dim = dim // num_heads if head_dim is None else head_dim
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if context_parallel_mode not in MODES:
            raise ValueError(f"context_parallel_mode must be one of {', '.join(map(repr, MODES))}, "
                             f"got {context_parallel_mode!r}")
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
        _check_shape("x", x, {"(batch, seqlen, dim)": (None, None, self.qkv.in_features)})
        _check_like_module("x", x, self.qkv.weight)
        batch, local_seqlen, _ = x.shape
        parallel = self.process_group is not None
        if parallel and attention_mask is not None:
            raise ValueError("attention_mask is not taken with a process_group: pack the sequences instead")
        if not parallel and seqlen is not None:
            raise ValueError("seqlen is the whole length of a sharded sequence: it needs a process_group")
        if attention_mask is not None and self.attention is not flash_attn_func:
            raise ValueError("attention_mask runs scaled_dot_product_attention, not the module's attention function")
        if not parallel and local_seqlen == 0:
            raise ValueError(f"x must hold at least one token (seqlen >= 1), got shape {tuple(x.shape)}")
        if attention_mask is not None:
            _check_shape("attention_mask", attention_mask, {"(batch, seqlen)": (batch, local_seqlen)}, x.device)
            if attention_mask.is_floating_point() or attention_mask.is_complex():
                raise TypeError(f"attention_mask must be bool or integer (True or 1 = real token, False or 0 = "
                                f"padding), got {attention_mask.dtype}")
        sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                 self.num_kv_heads * self.head_dim)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in self.qkv(x).split(sizes, dim=-1))  # (B, L, H, D)
        if self.rotary is not None:
            if positions is None and parallel:
                positions = shard_positions(local_seqlen, self.process_group, seqlen, x.device)
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
