"""KV-cache problems for the tests, and their reference answers computed the plain way.

The reference rotates with the "rotate half" form used by model code (x * cos + rotate_half(x) * sin,
the angle tables repeated to the full rotary width), appends with plain indexing into a contiguous
cache, and runs ``attention_ref`` over each batch element's keys. In float64 it is the oracle; in the
input dtype it is the "plain PyTorch" baseline of the tolerance rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from flashattn.reference import attention_ref


@dataclass(frozen=True)
class KVProblem:
    """One flash_attn_with_kvcache call. cache_seqlens[b] keys are in the cache before the append."""

    batch: int = 2
    seqlen_q: int = 1
    seqlen_new: int = 1  # 0: no k, v to append
    nheads: int = 4
    nheads_k: int = 2
    head_dim: int = 40
    capacity: int = 48  # keys one cache row holds (a multiple of page_size when paged)
    cache_seqlens: tuple[int, ...] = (13, 30)
    rotary_dim: int = 0
    interleaved: bool = True
    leftpad: tuple[int, ...] | None = None
    batch_cache: int | None = None  # with a value: the cache has this many rows, addressed by cache_batch_idx
    page_size: int | None = None
    num_splits: int = 0
    options: dict = field(default_factory=dict)  # causal, window_size, softcap, softmax_scale, alibi

    def __str__(self) -> str:
        parts = [f"b{self.batch}-q{self.seqlen_q}-new{self.seqlen_new}-h{self.nheads}/{self.nheads_k}"
                 f"-d{self.head_dim}-cap{self.capacity}"]
        if self.rotary_dim:
            parts.append(f"rot{self.rotary_dim}{'i' if self.interleaved else 'n'}")
        if self.leftpad:
            parts.append("leftpad")
        if self.batch_cache:
            parts.append("batchidx")
        if self.page_size:
            parts.append(f"page{self.page_size}")
        if self.num_splits:
            parts.append(f"split{self.num_splits}")
        parts += [f"{k}={v}" for k, v in self.options.items()]
        return "-".join(parts)


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
               interleaved: bool) -> torch.Tensor:
    """x (B, S, H, D) rotated at positions (B, S), computed in x's dtype: x * cos + rotate_half(x) * sin."""
    rotary_dim = 2 * cos.shape[1]
    cos, sin = cos.to(x.dtype)[positions], sin.to(x.dtype)[positions]  # (B, S, R / 2)
    if interleaved:
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        head = x[..., :rotary_dim]
        pairs = head.unflatten(-1, (-1, 2))
        rotated_half = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        head = x[..., :rotary_dim]
        first, second = head[..., : rotary_dim // 2], head[..., rotary_dim // 2 :]
        rotated_half = torch.cat((-second, first), dim=-1)
    rotated = head * cos.unsqueeze(2) + rotated_half * sin.unsqueeze(2)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def build(problem: KVProblem, dtype: torch.dtype, device, seed: int = 0) -> dict:
    """Random inputs for ``problem`` as flash_attn_with_kvcache keyword arguments (contiguous cache)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype=dtype, device=device)

    p = problem
    rows = p.batch_cache or p.batch
    inputs = dict(
        q=randn(p.batch, p.seqlen_q, p.nheads, p.head_dim),
        k_cache=randn(rows, p.capacity, p.nheads_k, p.head_dim),
        v_cache=randn(rows, p.capacity, p.nheads_k, p.head_dim),
        cache_seqlens=torch.tensor(p.cache_seqlens, dtype=torch.int32, device=device),
        num_splits=p.num_splits,
    )
    if p.seqlen_new:
        inputs["k"] = randn(p.batch, p.seqlen_new, p.nheads_k, p.head_dim)
        inputs["v"] = randn(p.batch, p.seqlen_new, p.nheads_k, p.head_dim)
    if p.rotary_dim:
        angles = torch.rand(p.capacity, p.rotary_dim // 2, generator=generator, dtype=torch.float64) * 2 * math.pi
        inputs["rotary_cos"] = angles.cos().to(dtype=dtype, device=device)
        inputs["rotary_sin"] = angles.sin().to(dtype=dtype, device=device)
        inputs["rotary_interleaved"] = p.interleaved
    if p.leftpad is not None:
        inputs["cache_leftpad"] = torch.tensor(p.leftpad, dtype=torch.int32, device=device)
    if p.batch_cache:
        inputs["cache_batch_idx"] = torch.randperm(rows, generator=generator)[: p.batch].to(torch.int32).to(device)
    options = dict(p.options)
    if options.get("alibi_slopes") == "per-head":
        options["alibi_slopes"] = (torch.rand(p.nheads, generator=generator) * 0.5).to(device)
    elif options.get("alibi_slopes") == "per-batch-head":
        options["alibi_slopes"] = (torch.rand(p.batch, p.nheads, generator=generator) * 0.5).to(device)
    inputs.update(options)
    return inputs


def to_paged(inputs: dict, page_size: int, seed: int = 1) -> dict:
    """The same problem with the cache cut into pages scattered over a larger pool through a block table.

    Blocks no sequence uses hold large values, so that reading one would show in the output.
    """
    k_cache, v_cache = inputs["k_cache"], inputs["v_cache"]
    rows, capacity = k_cache.shape[:2]
    assert capacity % page_size == 0, "paged problems use a capacity that is a multiple of page_size"
    pages = capacity // page_size
    num_blocks = rows * pages + 3  # a few blocks nobody owns
    generator = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(num_blocks, generator=generator)[: rows * pages].view(rows, pages)

    def scatter(cache: torch.Tensor) -> torch.Tensor:
        pool = torch.full((num_blocks, page_size, *cache.shape[2:]), 1e3, dtype=cache.dtype, device=cache.device)
        pool[order.to(cache.device).view(-1)] = cache.reshape(rows * pages, page_size, *cache.shape[2:])
        return pool

    paged = dict(inputs)
    paged.update(k_cache=scatter(k_cache), v_cache=scatter(v_cache),
                 block_table=order.to(torch.int32).to(k_cache.device))
    return paged


def gather_paged(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """A paged cache (num_blocks, page, Hk, D) read back as contiguous rows (rows, max_blocks * page, Hk, D)."""
    rows, pages = block_table.shape
    return cache[block_table.long().view(-1)].reshape(rows, pages * cache.shape[1], *cache.shape[2:])


def expected(inputs: dict, upcast: bool) -> dict:
    """The reference: caches after the append, out and lse, in float64 (upcast) or the inputs' dtype.

    ``inputs`` must describe a contiguous cache (before any call mutates it).
    """
    dtype = torch.float64 if upcast else inputs["q"].dtype
    q = inputs["q"].to(dtype)
    k_cache, v_cache = inputs["k_cache"].to(dtype).clone(), inputs["v_cache"].to(dtype).clone()
    batch, seqlen_q = q.shape[:2]
    cache_seqlens = inputs["cache_seqlens"].long()
    rows = inputs.get("cache_batch_idx")
    rows = torch.arange(batch, device=q.device) if rows is None else rows.long()
    k_new, v_new = inputs.get("k"), inputs.get("v")
    seqlen_new = 0 if k_new is None else k_new.shape[1]
    causal = inputs.get("causal", False)
    window = inputs.get("window_size", (-1, -1))
    cos, sin = inputs.get("rotary_cos"), inputs.get("rotary_sin")
    interleaved = inputs.get("rotary_interleaved", True)
    if k_new is not None:
        k_new = k_new.to(dtype)
        if cos is not None:
            positions = cache_seqlens.view(-1, 1) + torch.arange(seqlen_new, device=q.device)
            k_new = rotary_ref(k_new, cos, sin, positions, interleaved)
        for b in range(batch):
            span = slice(int(cache_seqlens[b]), int(cache_seqlens[b]) + seqlen_new)
            k_cache[rows[b], span] = k_new[b]
            v_cache[rows[b], span] = v_new[b].to(dtype)
    if cos is not None:
        per_token = causal or tuple(window) != (-1, -1)
        steps = torch.arange(seqlen_q, device=q.device) if per_token else torch.zeros(seqlen_q, dtype=torch.long,
                                                                                      device=q.device)
        q = rotary_ref(q, cos, sin, cache_seqlens.view(-1, 1) + steps, interleaved)
    leftpad = inputs.get("cache_leftpad")
    slopes = inputs.get("alibi_slopes")
    outs, lses = [], []
    for b in range(batch):
        start = 0 if leftpad is None else int(leftpad[b])
        keys = slice(start, int(cache_seqlens[b]) + seqlen_new)
        slopes_b = None if slopes is None else (slopes[b : b + 1] if slopes.dim() == 2 else slopes)
        out, lse = attention_ref(q[b : b + 1], k_cache[rows[b], keys].unsqueeze(0), v_cache[rows[b], keys].unsqueeze(0),
                                 softmax_scale=inputs.get("softmax_scale"), causal=causal, window_size=window,
                                 softcap=inputs.get("softcap", 0.0), alibi_slopes=slopes_b, upcast=upcast)
        outs.append(out)
        lses.append(lse)
    return dict(k_cache=k_cache, v_cache=v_cache, out=torch.cat(outs), lse=torch.cat(lses))


def variant(problem: KVProblem, **changes) -> KVProblem:
    return replace(problem, **changes)
