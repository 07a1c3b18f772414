"""``torch.nn.functional.scaled_dot_product_attention``, computed by flashattn's kernels.

Same signature, layout and semantics as torch's: query (batch, heads, Lq, E), key/value (batch, heads_k,
Lk, E), output (batch, heads, Lq, E). The inputs are transposed to flashattn's (batch, seqlen, heads, E)
as views (no copy while the last dim is contiguous), and the output comes back the same way.

``is_causal`` is torch's: aligned to the TOP-LEFT corner of the score matrix (query i sees keys 0..i),
unlike flashattn's ``causal`` (bottom-right). For Lq = 2, Lk = 5 and for Lq = 5, Lk = 2::

    1 0 0 0 0          1 0
    1 1 0 0 0          1 1
                       1 1
                       1 1
                       1 1

With Lq <= Lk no query sees a key past Lq - 1, so those keys are dropped (a view) and the rest is a
square causal problem; with Lq > Lk it is flashattn's window (-1, Lq - Lk), whose right edge passes
through (i, i).

``attn_mask`` is a boolean (True = take part) or additive float mask broadcastable to
(batch, heads, Lq, Lk). It is read tile by tile inside the kernels through a broadcast view: a (Lq, Lk)
mask costs Lq x Lk, not batch x heads x Lq x Lk. A float mask that requires grad gets its gradient;
that gradient is built as a float32 (batch, heads, Lq, Lk) buffer and summed over the mask's broadcast
dims, so it costs O(Lq x Lk) memory per batch and head, and only when it is asked for. The kernels
compute the tiles that ``is_causal`` leaves, less those that ``attn_mask`` hides entirely (all False,
or all -inf): ``launch/mask_blocks.py`` summarizes the mask per tile once per call, and the kernels walk
only the tiles with a visible score (so a causal mask costs the causal half).

A row that no key may be seen by (its mask all False or -inf) gives 0, with zero gradients, as torch
2.5+ does; so do calls without keys (Lk = 0), and calls without queries give an empty output. Unlike
torch, ``attn_mask`` and ``is_causal`` may be given together (both apply).
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import re
import threading
import warnings

import torch
import torch.nn.functional as F

from .autograd import EmptyAttentionFunction, FlashAttnFunction
from .options import AttentionOptions
from .sinks import check_sinks
from .validation import MAX_HEAD_DIM, SUPPORTED_DTYPES, check_scale


def _check_inputs(query, key, value) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.is_nested:
            raise TypeError(f"{name} must be a dense tensor: flashattn takes no nested tensors")
        if x.dim() not in (3, 4):
            raise ValueError(f"{name} must have 4 dimensions (batch, heads, seqlen, headdim) or 3 (heads, "
                             f"seqlen, headdim), got shape {tuple(x.shape)}")
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    for name, x in (("key", key), ("value", value)):
        if x.dim() != query.dim():
            raise ValueError(f"{name} must have query's rank {query.dim()}, got shape {tuple(x.shape)}")
        if x.dtype != query.dtype:
            raise TypeError(f"{name} must have query's dtype {query.dtype}, got {x.dtype}")
        if x.device != query.device:
            raise ValueError(f"{name} must be on query's device {query.device}, got {x.device}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"key and value must agree in all but the last dim, got {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")
    if query.dim() == 4 and key.shape[0] != query.shape[0]:
        raise ValueError(f"key and value must have query's batch size {query.shape[0]}, got {key.shape[0]}")
    head_dim = query.shape[-1]
    if key.shape[-1] != head_dim:
        raise ValueError(f"key must have query's head dim {head_dim}, got {key.shape[-1]}")
    if value.shape[-1] != head_dim:
        raise ValueError(f"value must have query's head dim {head_dim} (flashattn computes one head dim), "
                         f"got {value.shape[-1]}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")


def _check_heads(nheads: int, nheads_k: int, enable_gqa: bool) -> None:
    if min(nheads, nheads_k) < 1:
        raise ValueError(f"query, key and value must have at least one head, got {nheads} and {nheads_k}")
    if nheads == nheads_k or nheads_k == 1:  # one kv head broadcasts, as in torch
        return
    if not enable_gqa:
        raise ValueError(f"query has {nheads} heads but key and value have {nheads_k}: pass enable_gqa=True "
                         f"for grouped-query attention, or give key and value {nheads} heads")
    if nheads % nheads_k != 0:
        raise ValueError(f"with enable_gqa=True the number of query heads ({nheads}) must be a multiple of "
                         f"the number of key/value heads ({nheads_k})")


def _check_mask(attn_mask, query: torch.Tensor, full_shape: tuple[int, ...]) -> None:
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        raise TypeError(f"attn_mask must be bool, float32 or query's dtype {query.dtype}, got {attn_mask.dtype}")
    if attn_mask.device != query.device:
        raise ValueError(f"attn_mask must be on query's device {query.device}, got {attn_mask.device}")
    try:
        broadcast = torch.broadcast_shapes(attn_mask.shape, full_shape)
    except RuntimeError:
        broadcast = None
    if attn_mask.dim() > len(full_shape) or broadcast != torch.Size(full_shape):
        raise ValueError(f"attn_mask must be broadcastable to (batch, heads, Lq, Lk) = {full_shape}, "
                         f"got shape {tuple(attn_mask.shape)}")


def check_arguments(query, key, value, attn_mask=None, dropout_p=0.0, enable_gqa=False) -> None:
    """Raise TypeError / ValueError, naming the argument, for what flashattn's SDPA does not take."""
    _check_inputs(query, key, value)
    _check_heads(query.shape[-3], key.shape[-3], enable_gqa)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float in [0, 1), got {type(dropout_p).__name__} {dropout_p!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if attn_mask is not None:
        _check_mask(attn_mask, query, (*query.shape[:-1], key.shape[-2]))


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Drop-in for :func:`torch.nn.functional.scaled_dot_product_attention`, without the N x N matrix.

    Args:
        query: (batch, heads, Lq, E) or (heads, Lq, E); float16 / bfloat16 / float32, E in 1..256.
        key, value: (batch, heads_k, Lk, E), the same E as query (flashattn has one head dim).
        attn_mask: bool (True = take part) or float (added to the scores; bool, float32 or query's
            dtype), broadcastable to (batch, heads, Lq, Lk). A float mask may require grad.
        dropout_p: dropout on the attention probabilities, applied whenever > 0 (as in torch).
        is_causal: top-left aligned causal mask (see the module docstring); may combine with attn_mask.
        scale: defaults to 1 / sqrt(E).
        enable_gqa: allow heads_k < heads (heads a multiple of heads_k; query head h uses kv head
            h // (heads // heads_k)). One kv head always broadcasts.

    Returns:
        (batch, heads, Lq, E) in query's dtype: a transposed view of a (batch, Lq, heads, E) tensor.
        Rows that see no key are 0.
    """
    check_arguments(query, key, value, attn_mask, dropout_p, enable_gqa)
    unbatched = query.dim() == 3
    if unbatched:
        query, key, value = (x.unsqueeze(0) for x in (query, key, value))
    out = attention_bhle(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return out.squeeze(0) if unbatched else out


def attention_bhle(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale: float | None,
                   softcap: float = 0.0, sliding_window: int | None = None,
                   sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The SDPA computation on checked 4-dim inputs, plus options torch's signature lacks.

    ``softcap`` > 0 caps the scores (``softcap * tanh(scores / softcap)``) before the mask is added;
    ``sliding_window`` w, with ``is_causal``, lets query i see keys i - w + 1 .. i (Hugging Face's
    sliding window), applied by the kernels' window, not by a mask. ``sinks`` (heads,): a learned logit
    per query head that joins every row's softmax without a value (GPT-OSS's attention sinks; it gets
    its gradient). Returns (batch, heads, Lq, E).
    """
    head_dim, seqlen_q, seqlen_k = query.shape[-1], query.shape[-2], key.shape[-2]
    mask = None if attn_mask is None else attn_mask[(None,) * (4 - attn_mask.dim())]  # 4 dims, as a view

    # (batch, heads, L, E) -> (batch, L, heads, E): views, read in place by the kernels
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    window = (-1, -1)
    if is_causal:
        if seqlen_q <= seqlen_k:
            k, v = k[:, :seqlen_q], v[:, :seqlen_q]  # keys no query sees under top-left causal
            if mask is not None and mask.shape[-1] != 1:
                mask = mask[..., :seqlen_q]
            window = (-1 if sliding_window is None else sliding_window - 1, 0)
        elif sliding_window is None:
            window = (-1, seqlen_q - seqlen_k)
        else:
            raise ValueError("sliding_window with is_causal needs Lq <= Lk")
    elif sliding_window is not None:
        raise ValueError("sliding_window needs is_causal=True")
    check_scale("scale", scale)
    check_sinks("sinks", sinks, query.shape[1], query.device)
    if seqlen_q == 0 or seqlen_k == 0:  # zeros, and zero gradients, as torch and flash_attn_func give
        out, _ = EmptyAttentionFunction.apply(q, k, v)
        return out.transpose(1, 2)
    opts = AttentionOptions.build(head_dim, scale, False, window, softcap, dropout_p, False)
    out, _ = FlashAttnFunction.apply(q, k, v, None, opts, mask, None, sinks)
    return out.transpose(1, 2)


NEED_WEIGHTS_WARNING = (
    "need_weights=True returns the attention matrix, which flashattn never materializes: pass "
    "need_weights=False to torch.nn.MultiheadAttention (or F.multi_head_attention_forward) for flashattn; "
    "these calls run torch's materializing computation"
)


@contextlib.contextmanager
def sdpa_override():
    """Route ``torch.nn.functional.scaled_dot_product_attention`` to flashattn inside the block.

    Code that looks the function up at call time (``F.scaled_dot_product_attention(...)``, as
    ``torch.nn.MultiheadAttention`` and Hugging Face's "sdpa" attention do) gets flashattn's. A call
    flashattn cannot take (float64, head dim > 256, value's head dim != query's, nested tensors, ...)
    goes to torch's own function, with one warning per distinct reason.

    ``torch.nn.MultiheadAttention`` (and ``TransformerEncoderLayer``) in eval mode without gradients
    would take torch's fused fast path, which never calls the function: the block turns that path off
    (``torch.backends.mha.set_fastpath_enabled(False)``), so those calls reach flashattn too. Nested-
    tensor inputs, which only the fast path takes, are then refused by torch. ``need_weights=True``
    (MultiheadAttention's default) asks for the attention matrix, which flashattn never builds: those
    calls run torch's computation, with one warning.

    Torch's function, ``F.multi_head_attention_forward`` and the fast-path setting are restored when the
    last open block exits, exceptions included. The patch is process-wide: other threads see it too, and
    blocks of several threads may overlap in any order.

    Example::

        with flashattn.sdpa_override():
            out = model(tokens)
    """
    _OVERRIDE.open()
    try:
        yield
    finally:
        _OVERRIDE.close()


class _Override:
    """``sdpa_override``'s process-wide patch: installed when the first block opens, undone when the last one
    closes, in whatever order the threads' blocks end (each block restoring what it found would leave the patch in
    place when two threads' blocks overlap)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocks = 0
        self.saved = None

    def open(self) -> None:
        with self.lock:
            if self.blocks == 0:
                self.saved = (F.scaled_dot_product_attention, F.multi_head_attention_forward,
                              torch.backends.mha.get_fastpath_enabled())
                F.scaled_dot_product_attention, F.multi_head_attention_forward = _routed(*self.saved[:2])
                torch.backends.mha.set_fastpath_enabled(False)
            self.blocks += 1

    def close(self) -> None:
        with self.lock:
            self.blocks -= 1
            if self.blocks == 0:
                F.scaled_dot_product_attention, F.multi_head_attention_forward, fastpath = self.saved
                torch.backends.mha.set_fastpath_enabled(fastpath)
                self.saved = None


_OVERRIDE = _Override()


def _routed(original, original_mha):
    """The functions the override installs in place of ``original`` (torch's SDPA) and ``original_mha``
    (``F.multi_head_attention_forward``), with one warning per reason while installed."""
    mha_parameters = inspect.signature(original_mha)
    warned: set[str] = set()

    def warn_once(reason: str) -> None:
        kind = re.sub(r"\d+", "#", reason)  # a reason once, whatever the sizes and values it quotes
        if kind not in warned:
            warned.add(kind)
            warnings.warn(f"flashattn.sdpa_override: {reason}", stacklevel=3)

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False, **torch_only):
        reason = f"arguments flashattn does not know: {sorted(torch_only)}" if torch_only else None
        if reason is None:
            try:
                check_arguments(query, key, value, attn_mask, dropout_p, enable_gqa)
                check_scale("scale", scale)
            except (TypeError, ValueError) as exc:
                reason = str(exc)
        if reason is None:
            return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                enable_gqa)
        warn_once(f"using torch's scaled_dot_product_attention: {reason}")
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa, **torch_only)

    def routed_mha(*args, **kwargs):
        # need_weights=False calls ``scaled_dot_product_attention`` (routed above); True materializes
        arguments = mha_parameters.bind(*args, **kwargs).arguments
        if arguments.get("need_weights", True):
            warn_once(NEED_WEIGHTS_WARNING)
        return original_mha(*args, **kwargs)

    return routed, routed_mha
