"""Count the HBM bytes and FLOPs of standard attention and of flashattn's kernels (``flashattn io``).

FlashAttention's claim is about IO: it computes the same attention as matmul + softmax + matmul with
fewer reads and writes of GPU memory. This module makes the claim a number for one problem shape: the
bytes each implementation moves (itemized per kernel and tensor), the FLOPs, the arithmetic intensity,
and the roofline time ``max(FLOPs / peak, bytes / bandwidth)`` on an H100 or H200 (measured ceilings,
see ``docs/perf-notes.md``).

**What is counted.** Every tile load and store the Triton kernels issue, exactly as they are written
(``kernels/forward.py``, ``kernels/backward.py``, with the block bounds of ``kernels/common.py``): the
forward streams every K and V tile its query block needs, so K and V are re-read once per query block
(and, with GQA, once per query head that shares them). Nothing is assumed to stay in the L2 cache
between programs, so the counts are the HBM traffic *with no reuse across programs*: an upper bound.
The main reason a measurement comes in lower is L2: programs running at the same time on different
SMs stream the same K/V tiles (all query blocks of one head want the same K and V), and the second
reader often finds them in L2. (The no-reuse forward's intensity tends to 2 * BLOCK_M / dtype bytes
FLOP/B as the sequence grows, whatever N and d: 128 in bf16 with 128-row tiles, under the H200's ridge
of 186. So this model calls flashattn memory-bound where L2 reuse can make it compute-bound; the
``if L2 kept all tiles`` figure, each tile fetched once per kernel, is the other bracket.)

**The standard implementation** is matmul, softmax, matmul with the Sq x Sk scores S and probabilities
P materialized in the input dtype (what PyTorch does for bf16/fp16 inputs), each op reading its inputs
from HBM and writing its output there. Assumptions, stated where they matter: a causal mask is applied
inside the softmax pass (no extra traffic, but the full Sq x Sk matrix is still computed and stored);
with GQA, each query head reads its kv head's K and V (a broadcast, not a materialized copy) and the
backward writes dK/dV per query head (the reduction over the group is not counted).

**FLOPs.** The convention every FlashAttention benchmark reports: forward ``4 * B * H * Sq * Sk * D``,
halved when causal; backward 2.5x the forward (5 matrix products against the forward's 2). What the
hardware executes differs, and the roofline uses that: flashattn's backward recomputes ``Q K^T`` in
both the dK/dV and the dQ kernel (7 products, 3.5x the forward); the standard backward keeps P and so
runs 4 products (2x), but on the full Sq x Sk matrix even when causal.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from .. import flops
from .units import positive_float, positive_int

EXIT_USAGE = 2  # the exit status of argparse for bad arguments; ``run`` uses it for bad values too
FLOAT32_BYTES = 4  # the log-sum-exp and delta rows are float32 whatever the input dtype
DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4}
# The Hopper tile table covers padded head dims up to this (configs' buckets: 64, 128, 256).
MAX_TABLE_HEAD_DIM = 256
# Shared memory per SM on H100 and H200 (datasheet, ANCHORS.md): the paper's M for the asymptotic form.
HOPPER_SRAM_KB = 228

Access = Literal["read", "write"]
# How a transfer scales: "linear" moves each element once; "quadratic" is an Sq x Sk matrix (standard
# attention only); "reread" is a tensor streamed again per tile of the other sequence (flashattn only).
Term = Literal["linear", "quadratic", "reread"]


class InvalidArgument(ValueError):
    """A bad value, with the name of the field it came from so that the CLI can name its flag."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# ---------------------------------------------------------------------------------------------
# The problem and the tiling
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionProblem:
    """One attention call's shape. ``dtype_bytes`` is the size of q, k, v, o and their gradients."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    causal: bool

    def __post_init__(self) -> None:
        for name in ("batch", "seqlen_q", "seqlen_k", "heads", "kv_heads", "head_dim", "dtype_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(name, f"expected a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise InvalidArgument("kv_heads", f"{self.kv_heads} kv heads do not divide {self.heads} query heads")

    @property
    def group_size(self) -> int:
        """Query heads per kv head (1 without GQA)."""
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class BlockShape:
    """One kernel's tile: ``block_m`` query rows by ``block_n`` key rows.

    ``passes``: how many times the kernel walks its tiles; 2 models a dK/dV kernel that runs as a dV pass
    and a dK pass, each with one accumulator (flashattn's kernels make one pass).
    """

    block_m: int
    block_n: int
    passes: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            # tl.arange needs a power of two and tl.dot at least 16 rows: the kernels take nothing else
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise InvalidArgument(name, f"expected a power of two >= 16, got {value!r}")
        if self.passes not in (1, 2):
            raise InvalidArgument("passes", f"expected 1 or 2 (a split dK/dV kernel), got {self.passes!r}")


def hopper_block_shape(phase: str, head_dim: int, masked: bool, dtype_bytes: int, seqlen: int = 0) -> BlockShape:
    """The tile ``configs.tile_config`` picks for ``phase`` on a Hopper GPU (``configs.lookup``, no device).

    ``seqlen``: the shorter of the query and key lengths (long sequences have their own entries).
    """
    import torch

    from .. import configs

    width = configs.padded_head_dim(head_dim)
    if width > MAX_TABLE_HEAD_DIM:
        raise InvalidArgument("head_dim", f"the Hopper tile table stops at {MAX_TABLE_HEAD_DIM}, got {head_dim}")
    dtype = torch.float32 if dtype_bytes == FLOAT32_BYTES else torch.bfloat16
    config = configs.lookup("hopper", phase, head_dim, masked, dtype, seqlen=seqlen)
    return block_shape(config)


def block_shape(config) -> BlockShape:
    """The IO model's view of a ``configs.TileConfig``: its tile, and the dK/dV kernel's passes."""
    return BlockShape(config.block_m, config.block_n, 1)


@dataclass(frozen=True)
class Tiling:
    """The tiles of the three kernels that move K/V or Q/dO more than once (the delta kernel streams)."""

    forward: BlockShape
    dkdv: BlockShape
    dq: BlockShape

    @classmethod
    def from_hopper_table(cls, head_dim: int, causal: bool, dtype_bytes: int, seqlen: int = 0) -> Tiling:
        """What flashattn runs on an H100/H200 (a causal mask is the only mask this model knows)."""
        return cls(*(hopper_block_shape(phase, head_dim, causal, dtype_bytes, seqlen)
                     for phase in ("forward", "dkdv", "dq")))

    @classmethod
    def for_problem(cls, problem: AttentionProblem) -> Tiling:
        return cls.from_hopper_table(problem.head_dim, problem.causal, problem.dtype_bytes,
                                     min(problem.seqlen_q, problem.seqlen_k))

    @classmethod
    def uniform(cls, block_m: int, block_n: int) -> Tiling:
        """The same tile in every kernel: handy for hand-checked examples."""
        shape = BlockShape(block_m, block_n)
        return cls(shape, shape, shape)

    def with_overrides(self, block_m: int | None = None, block_n: int | None = None) -> Tiling:
        """Replace block_m and/or block_n in every kernel, keeping the table's value for the other."""
        changes = {name: value for name, value in (("block_m", block_m), ("block_n", block_n)) if value is not None}
        if not changes:
            return self
        return Tiling(replace(self.forward, **changes), replace(self.dkdv, **changes), replace(self.dq, **changes))


# ---------------------------------------------------------------------------------------------
# Which rows each program loads: the kernels' block bounds, for no mask or a causal mask
# ---------------------------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def keys_loaded_per_query_block(problem: AttentionProblem, block: BlockShape) -> list[int]:
    """Key rows one forward (or dQ) program loads, for each query block of one head.

    Mirrors ``key_block_bounds`` with causal = ``window_right == 0`` (bottom-right aligned when
    Sq != Sk): the program loops over key blocks ``[lo, hi)`` in steps of ``block_n``; boundary blocks
    mask their loads at ``seqlen_k``, so the last block loads only up to it. A causal diagonal block
    is loaded whole (its masked half is computed and discarded): the count is at block granularity.
    """
    seqlen_q, seqlen_k = problem.seqlen_q, problem.seqlen_k
    offset = seqlen_k - seqlen_q
    counts = []
    for start_m in range(0, seqlen_q, block.block_m):
        last_row = min(start_m + block.block_m, seqlen_q) - 1
        lo, hi = 0, seqlen_k
        if problem.causal:
            hi = min(last_row + offset + 1, seqlen_k)
        hi = max(hi, lo)
        end = min(lo + _cdiv(hi - lo, block.block_n) * block.block_n, seqlen_k)
        counts.append(max(end - lo, 0))
    return counts


def query_rows_loaded_per_key_block(problem: AttentionProblem, block: BlockShape) -> list[int]:
    """Query rows one dK/dV program loads per query head, for each key block of one kv head.

    Mirrors ``query_block_bounds``: causal starts the loop at the first query block that sees the key
    block (rounded down to ``block_m``) and runs to ``seqlen_q``, loads masked there.
    """
    seqlen_q, seqlen_k = problem.seqlen_q, problem.seqlen_k
    offset = seqlen_k - seqlen_q
    counts = []
    for start_n in range(0, seqlen_k, block.block_n):
        lo = 0
        if problem.causal:
            lo = (max(start_n - offset, 0) // block.block_m) * block.block_m
        counts.append(max(seqlen_q - lo, 0))
    return counts


# ---------------------------------------------------------------------------------------------
# Itemized bytes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transfer:
    """One tensor's traffic in one kernel (summed over every program and every batch x head)."""

    kernel: str
    tensor: str
    access: Access
    nbytes: int
    term: Term = "linear"
    # For a re-read: the tensor's own size, what the kernel would move if L2 kept every tile it fetched.
    tensor_nbytes: int | None = None

    @property
    def once_nbytes(self) -> int:
        """The bytes with perfect reuse across programs: each tile fetched from HBM once per kernel."""
        return self.nbytes if self.tensor_nbytes is None else self.tensor_nbytes


def _total(transfers: list[Transfer], term: Term | None = None) -> int:
    return sum(t.nbytes for t in transfers if term is None or t.term == term)


def _standard_sizes(problem: AttentionProblem) -> tuple[int, int, int]:
    """Bytes of one q-shaped tensor, of one k/v-shaped tensor (read per query head: GQA broadcasts, no
    copy), and of one Sq x Sk matrix, for all batches and query heads."""
    p = problem
    heads = p.batch * p.heads
    return (heads * p.seqlen_q * p.head_dim * p.dtype_bytes,
            heads * p.seqlen_k * p.head_dim * p.dtype_bytes,
            heads * p.seqlen_q * p.seqlen_k * p.dtype_bytes)


def standard_forward_bytes(problem: AttentionProblem) -> list[Transfer]:
    """S = Q K^T, P = softmax(S), O = P V: three kernels, the Sq x Sk matrices round-tripping HBM."""
    q_bytes, kv_bytes, matrix = _standard_sizes(problem)
    return [
        Transfer("S = Q K^T", "q", "read", q_bytes),
        Transfer("S = Q K^T", "k", "read", kv_bytes),
        Transfer("S = Q K^T", "S", "write", matrix, "quadratic"),
        Transfer("softmax", "S", "read", matrix, "quadratic"),
        Transfer("softmax", "P", "write", matrix, "quadratic"),
        Transfer("O = P V", "P", "read", matrix, "quadratic"),
        Transfer("O = P V", "v", "read", kv_bytes),
        Transfer("O = P V", "o", "write", q_bytes),
    ]


def standard_backward_bytes(problem: AttentionProblem) -> list[Transfer]:
    """dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K, dK = dS^T Q, with P saved.

    The softmax backward reads P and dP once and writes dS (its row sums are fused into the pass).
    """
    q_bytes, kv_bytes, matrix = _standard_sizes(problem)
    return [
        Transfer("dV = P^T dO", "P", "read", matrix, "quadratic"),
        Transfer("dV = P^T dO", "do", "read", q_bytes),
        Transfer("dV = P^T dO", "dv", "write", kv_bytes),
        Transfer("dP = dO V^T", "do", "read", q_bytes),
        Transfer("dP = dO V^T", "v", "read", kv_bytes),
        Transfer("dP = dO V^T", "dP", "write", matrix, "quadratic"),
        Transfer("softmax backward", "P", "read", matrix, "quadratic"),
        Transfer("softmax backward", "dP", "read", matrix, "quadratic"),
        Transfer("softmax backward", "dS", "write", matrix, "quadratic"),
        Transfer("dQ = dS K", "dS", "read", matrix, "quadratic"),
        Transfer("dQ = dS K", "k", "read", kv_bytes),
        Transfer("dQ = dS K", "dq", "write", q_bytes),
        Transfer("dK = dS^T Q", "dS", "read", matrix, "quadratic"),
        Transfer("dK = dS^T Q", "q", "read", q_bytes),
        Transfer("dK = dS^T Q", "dk", "write", kv_bytes),
    ]


def flashattn_forward_bytes(problem: AttentionProblem, tiling: Tiling) -> list[Transfer]:
    """One program per (query block, batch x head): q once, every needed K/V tile, O and the LSE row."""
    p = problem
    heads = p.batch * p.heads
    row_bytes = p.head_dim * p.dtype_bytes
    keys_streamed = sum(keys_loaded_per_query_block(p, tiling.forward))  # per query head
    kv_tensor = p.batch * p.kv_heads * p.seqlen_k * row_bytes
    return [
        Transfer("forward", "q", "read", heads * p.seqlen_q * row_bytes),
        Transfer("forward", "k", "read", heads * keys_streamed * row_bytes, "reread", kv_tensor),
        Transfer("forward", "v", "read", heads * keys_streamed * row_bytes, "reread", kv_tensor),
        Transfer("forward", "o", "write", heads * p.seqlen_q * row_bytes),
        Transfer("forward", "lse", "write", heads * p.seqlen_q * FLOAT32_BYTES),
    ]


def flashattn_backward_bytes(problem: AttentionProblem, tiling: Tiling) -> list[Transfer]:
    """The delta kernel, then dK/dV (per key block and kv head, walking the group's query heads),
    then dQ (per query block and head, streaming K/V as the forward does).

    A split dK/dV kernel (``tiling.dkdv.passes == 2``) reads K, q, dO and the LSE in both passes, V and
    delta in the dK pass only; its second read of K counts as a re-read.
    """
    p = problem
    heads = p.batch * p.heads
    kv_heads = p.batch * p.kv_heads
    row_bytes = p.head_dim * p.dtype_bytes
    q_rows = heads * p.seqlen_q
    kv_rows = kv_heads * p.seqlen_k
    passes = tiling.dkdv.passes
    # dK/dV: each kv head's program reads q/dO/lse/delta of every query head in its group
    query_rows_streamed = kv_heads * p.group_size * sum(query_rows_loaded_per_key_block(p, tiling.dkdv))
    keys_streamed = heads * sum(keys_loaded_per_query_block(p, tiling.dq))
    k_read = (Transfer("dkdv", "k", "read", kv_rows * row_bytes) if passes == 1
              else Transfer("dkdv", "k", "read", passes * kv_rows * row_bytes, "reread", kv_rows * row_bytes))
    return [
        Transfer("delta", "o", "read", q_rows * row_bytes),
        Transfer("delta", "do", "read", q_rows * row_bytes),
        Transfer("delta", "delta", "write", q_rows * FLOAT32_BYTES),
        k_read,
        Transfer("dkdv", "v", "read", kv_rows * row_bytes),
        Transfer("dkdv", "q", "read", passes * query_rows_streamed * row_bytes, "reread", q_rows * row_bytes),
        Transfer("dkdv", "do", "read", passes * query_rows_streamed * row_bytes, "reread", q_rows * row_bytes),
        Transfer("dkdv", "lse", "read", passes * query_rows_streamed * FLOAT32_BYTES, "reread",
                 q_rows * FLOAT32_BYTES),
        Transfer("dkdv", "delta", "read", query_rows_streamed * FLOAT32_BYTES, "reread", q_rows * FLOAT32_BYTES),
        Transfer("dkdv", "dk", "write", kv_rows * row_bytes),
        Transfer("dkdv", "dv", "write", kv_rows * row_bytes),
        Transfer("dq", "q", "read", q_rows * row_bytes),
        Transfer("dq", "do", "read", q_rows * row_bytes),
        Transfer("dq", "lse", "read", q_rows * FLOAT32_BYTES),
        Transfer("dq", "delta", "read", q_rows * FLOAT32_BYTES),
        Transfer("dq", "k", "read", keys_streamed * row_bytes, "reread", kv_rows * row_bytes),
        Transfer("dq", "v", "read", keys_streamed * row_bytes, "reread", kv_rows * row_bytes),
        Transfer("dq", "dq", "write", q_rows * row_bytes),
    ]


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------


def _full_forward_flops(problem: AttentionProblem) -> int:
    p = problem
    return 4 * p.batch * p.heads * p.seqlen_q * p.seqlen_k * p.head_dim


def forward_flops(problem: AttentionProblem) -> int:
    """The convention (``flashattn.flops``)."""
    p = problem
    return flops.forward_flops(p.batch, p.seqlen_q, p.seqlen_k, p.heads, p.head_dim, p.causal)


def backward_flops(problem: AttentionProblem) -> int:
    """The convention (``flashattn.flops``): 2.5x the forward."""
    p = problem
    return flops.backward_flops(p.batch, p.seqlen_q, p.seqlen_k, p.heads, p.head_dim, p.causal)


def flashattn_backward_flops_executed(problem: AttentionProblem, tiling: Tiling | None = None) -> int:
    """What flashattn's backward runs: Q K^T is recomputed in the dK/dV and in the dQ kernel, and
    dO V^T as well, so 7 matmuls for the forward's 2 (3.5x); a split dK/dV kernel (``tiling``) computes
    Q K^T in both of its passes: 8 (4x). Causal halving as in the convention (the masked halves of
    diagonal tiles, also computed, are ignored)."""
    passes = 1 if tiling is None else tiling.dkdv.passes
    return forward_flops(problem) * (6 + passes) // 2


def standard_forward_flops_executed(problem: AttentionProblem) -> int:
    """The standard forward computes the whole Sq x Sk matrix, masked or not."""
    return _full_forward_flops(problem)


def standard_backward_flops_executed(problem: AttentionProblem) -> int:
    """With P saved, the standard backward runs 4 matmuls (dV, dP, dQ, dK) on the whole matrix: 2x."""
    return 2 * _full_forward_flops(problem)


# ---------------------------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float  # FLOP/s of a dense bf16 matmul
    bandwidth: float  # bytes/s, read + written (a device-to-device copy)

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte above which a kernel is compute-bound on this GPU."""
        return self.peak_flops / self.bandwidth


# Measured on the project's machines (docs/perf-notes.md, ANCHORS.md): not datasheet figures.
GPU_PRESETS = {
    "h100": Gpu("H100 (measured)", 789e12, 3.02e12),
    "h200": Gpu("H200 (measured)", 788e12, 4.23e12),
}


@dataclass(frozen=True)
class Roofline:
    flops: int
    nbytes: int
    intensity: float  # FLOP / byte
    compute_seconds: float
    memory_seconds: float
    seconds: float
    bound: Literal["compute", "memory"]


def roofline(flops: int, nbytes: int, gpu: Gpu) -> Roofline:
    """The time floor of a kernel on ``gpu``: whichever of its FLOPs and its bytes takes longer."""
    compute_seconds = flops / gpu.peak_flops
    memory_seconds = nbytes / gpu.bandwidth
    bound: Literal["compute", "memory"] = "compute" if compute_seconds >= memory_seconds else "memory"
    return Roofline(flops, nbytes, flops / nbytes, compute_seconds, memory_seconds,
                    max(compute_seconds, memory_seconds), bound)


# ---------------------------------------------------------------------------------------------
# The whole analysis
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassReport:
    """One pass (forward or backward) of one implementation."""

    implementation: Literal["standard", "flashattn"]
    direction: Literal["forward", "backward"]
    transfers: list[Transfer]
    flops_convention: int
    roofline: Roofline  # of the executed FLOPs

    @property
    def nbytes(self) -> int:
        return _total(self.transfers)

    @property
    def once_nbytes(self) -> int:
        """The bytes if L2 kept every tile: the lower bracket, as ``nbytes`` is the upper one."""
        return sum(t.once_nbytes for t in self.transfers)

    @property
    def flops_executed(self) -> int:
        return self.roofline.flops

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "bytes_once": self.once_nbytes,
            "bytes_by_term": {term: _total(self.transfers, term) for term in ("linear", "quadratic", "reread")},
            "transfers": [{**asdict(t), "once_nbytes": t.once_nbytes} for t in self.transfers],
            "flops_convention": self.flops_convention,
            "flops_executed": self.flops_executed,
            "intensity": self.roofline.intensity,
            "compute_seconds": self.roofline.compute_seconds,
            "memory_seconds": self.roofline.memory_seconds,
            "roofline_seconds": self.roofline.seconds,
            "bound": self.roofline.bound,
        }


@dataclass(frozen=True)
class Asymptotic:
    """The FlashAttention paper's forms (Theorem 2), evaluated with constant 1, in bytes.

    Standard attention moves Theta(N d + N^2) elements per head, the tiled algorithm
    Theta(N^2 d^2 / M) with M the SRAM size in elements. The exact count maps to it through the K/V
    re-reads: ``2 * ceil(Sq / BLOCK_M) * Sk * d`` elements per head, and the paper's tile
    BLOCK_M ~ M / (4 d) makes that ``8 * Sq * Sk * d^2 / M``: the Theta term with constant 8.
    """

    sram_bytes: int
    sram_elements: int
    paper_block_m: float  # M / (4 d)
    standard_theta_bytes: int  # ((Sq + Sk) d + Sq Sk) per head
    tiled_theta_bytes: float  # Sq Sk d^2 / M per head
    exact_kv_reread_bytes: int  # flashattn forward's K and V reads, with the tiling's BLOCK_M
    kv_reread_bytes_at_paper_block_m: float  # 2 (Sq / (M / 4d)) Sk d per head = 8 x tiled_theta


def asymptotic(problem: AttentionProblem, tiling: Tiling, sram_kb: float = HOPPER_SRAM_KB) -> Asymptotic:
    p = problem
    heads = p.batch * p.heads
    sram_bytes = int(sram_kb * 1024)
    sram_elements = sram_bytes // p.dtype_bytes
    paper_block_m = sram_elements / (4 * p.head_dim)
    forward = flashattn_forward_bytes(p, tiling)
    return Asymptotic(
        sram_bytes=sram_bytes,
        sram_elements=sram_elements,
        paper_block_m=paper_block_m,
        standard_theta_bytes=heads * ((p.seqlen_q + p.seqlen_k) * p.head_dim + p.seqlen_q * p.seqlen_k)
        * p.dtype_bytes,
        tiled_theta_bytes=heads * p.seqlen_q * p.seqlen_k * p.head_dim**2 / sram_elements * p.dtype_bytes,
        exact_kv_reread_bytes=_total(forward, "reread"),
        kv_reread_bytes_at_paper_block_m=heads * 2 * (p.seqlen_q / paper_block_m) * p.seqlen_k * p.head_dim
        * p.dtype_bytes,
    )


@dataclass(frozen=True)
class IoReport:
    problem: AttentionProblem
    tiling: Tiling
    gpu: Gpu
    standard_forward: PassReport
    flashattn_forward: PassReport
    standard_backward: PassReport
    flashattn_backward: PassReport
    asymptotic: Asymptotic

    def to_dict(self) -> dict[str, Any]:
        return {
            "problem": asdict(self.problem),
            "tiling": asdict(self.tiling),
            "gpu": {**asdict(self.gpu), "ridge_intensity": self.gpu.ridge_intensity},
            "standard": {"forward": self.standard_forward.to_dict(), "backward": self.standard_backward.to_dict()},
            "flashattn": {"forward": self.flashattn_forward.to_dict(), "backward": self.flashattn_backward.to_dict()},
            "asymptotic": asdict(self.asymptotic),
            "model": "HBM bytes with no reuse across programs (L2 ignored): an upper bound on traffic",
        }


def analyze(problem: AttentionProblem, tiling: Tiling | None = None, gpu: Gpu = GPU_PRESETS["h200"],
            sram_kb: float = HOPPER_SRAM_KB) -> IoReport:
    """Bytes, FLOPs and roofline of both implementations, forward and backward."""
    tiling = Tiling.for_problem(problem) if tiling is None else tiling

    def make(implementation, direction, transfers, convention, executed) -> PassReport:
        return PassReport(implementation, direction, transfers, convention, roofline(executed, _total(transfers), gpu))

    return IoReport(
        problem, tiling, gpu,
        make("standard", "forward", standard_forward_bytes(problem), forward_flops(problem),
             standard_forward_flops_executed(problem)),
        make("flashattn", "forward", flashattn_forward_bytes(problem, tiling), forward_flops(problem),
             forward_flops(problem)),
        make("standard", "backward", standard_backward_bytes(problem), backward_flops(problem),
             standard_backward_flops_executed(problem)),
        make("flashattn", "backward", flashattn_backward_bytes(problem, tiling), backward_flops(problem),
             flashattn_backward_flops_executed(problem, tiling)),
        asymptotic(problem, tiling, sram_kb),
    )


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def _scaled(value: float, unit: str, prefixes: tuple[str, ...] = ("", "K", "M", "G", "T", "P", "E")) -> str:
    """Decimal prefixes (bandwidths are quoted in TB/s, so bytes are too): 3 significant digits."""
    index = 0
    while abs(value) >= 1000 and index < len(prefixes) - 1:
        value /= 1000
        index += 1
    digits = 0 if abs(value) >= 100 or index == 0 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {prefixes[index]}{unit}"


def format_bytes(nbytes: float) -> str:
    return _scaled(nbytes, "B")


def format_flops(flops: float) -> str:
    return _scaled(flops, "FLOP")


def format_seconds(seconds: float) -> str:
    """Milliseconds from 10 us up, as docs/perf-notes.md quotes its floors, so that columns compare at a glance."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-5:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "| " + " | ".join(padded) + " |"

    separator = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return [line(header), separator, *(line(row) for row in rows)]


def format_report(report: IoReport) -> str:
    """The table ``flashattn io`` prints: the four passes side by side, then the itemized bytes."""
    p, g = report.problem, report.gpu
    passes = [report.standard_forward, report.flashattn_forward, report.standard_backward, report.flashattn_backward]
    gqa = f", {p.kv_heads} kv heads" if p.kv_heads != p.heads else ""
    seqlen = f"seqlen {p.seqlen_q}" if p.seqlen_q == p.seqlen_k else f"seqlen_q {p.seqlen_q}, seqlen_k {p.seqlen_k}"
    dtype = {2: "16-bit", 4: "fp32"}.get(p.dtype_bytes, f"{p.dtype_bytes}-byte")
    tiles = ", ".join(f"{name} {b.block_m}x{b.block_n}" for name, b in
                      (("forward", report.tiling.forward), ("dkdv", report.tiling.dkdv), ("dq", report.tiling.dq)))
    lines = [
        f"Attention IO: batch {p.batch}, {seqlen}, {p.heads} heads{gqa}, head dim {p.head_dim}, {dtype}, "
        f"{'causal' if p.causal else 'non-causal'}",
        f"Tiles (block_m x block_n): {tiles}",
        f"GPU: {g.name}: {g.peak_flops / 1e12:.0f} TFLOP/s, {g.bandwidth / 1e12:.2f} TB/s "
        f"(ridge {g.ridge_intensity:.0f} FLOP/B)",
        "",
    ]
    header = ["", "fwd standard", "fwd flashattn", "bwd standard", "bwd flashattn"]
    rows = [
        ["HBM bytes", *(format_bytes(x.nbytes) for x in passes)],
        ["  Sq x Sk matrices", *(format_bytes(_total(x.transfers, "quadratic")) for x in passes)],
        ["  tile re-reads", *(format_bytes(_total(x.transfers, "reread")) for x in passes)],
        ["  if L2 kept all tiles", *(format_bytes(x.once_nbytes) for x in passes)],
        ["FLOPs (convention)", *(format_flops(x.flops_convention) for x in passes)],
        ["FLOPs (executed)", *(format_flops(x.flops_executed) for x in passes)],
        ["intensity (FLOP/B)", *(f"{x.roofline.intensity:.1f}" for x in passes)],
        ["FLOPs / peak", *(format_seconds(x.roofline.compute_seconds) for x in passes)],
        ["bytes / bandwidth", *(format_seconds(x.roofline.memory_seconds) for x in passes)],
        ["roofline time", *(format_seconds(x.roofline.seconds) for x in passes)],
        ["bound", *(x.roofline.bound for x in passes)],
    ]
    lines += _markdown_table(header, rows)
    lines += [
        "",
        f"Bytes, standard / flashattn: forward {passes[0].nbytes / passes[1].nbytes:.2f}x, "
        f"backward {passes[2].nbytes / passes[3].nbytes:.2f}x.",
        "",
        "Itemized bytes (kernel: tensor access):",
    ]
    for x in passes:
        lines.append(f"  {x.implementation} {x.direction}: {format_bytes(x.nbytes)}")
        for t in x.transfers:
            note = {"quadratic": "  (Sq x Sk)",
                    "reread": f"  (re-read per tile; the tensor is {format_bytes(t.once_nbytes)})"}.get(t.term, "")
            lines.append(f"    {t.kernel + ':':<18} {t.tensor:<6} {t.access:<5} {format_bytes(t.nbytes):>10}{note}")
    a = report.asymptotic
    lines += [
        "",
        f"FlashAttention paper (Theorem 2), constant 1, M = {a.sram_bytes // 1024} KB = {a.sram_elements} elements:",
        f"  standard  Theta(N d + N^2)   = {format_bytes(a.standard_theta_bytes)}",
        f"  tiled     Theta(N^2 d^2 / M) = {format_bytes(a.tiled_theta_bytes)}",
        f"  exact forward K+V reads (2 ceil(Sq/BLOCK_M) Sk d non-causal), BLOCK_M {report.tiling.forward.block_m}: "
        f"{format_bytes(a.exact_kv_reread_bytes)}",
        f"  the same with the paper's BLOCK_M = M/(4d) = {a.paper_block_m:.0f}: 8 N^2 d^2 / M = "
        f"{format_bytes(a.kv_reread_bytes_at_paper_block_m)}",
        "",
        "Model: HBM traffic with no reuse across programs (L2 ignored), an upper bound; times and bounds use it.",
        "Measured traffic is lower, mainly because programs running at once share K/V (backward: Q/dO) tiles in",
        "L2; 'if L2 kept all tiles' is the lower bracket. Standard attention keeps S and P in the input dtype and",
        "computes the full Sq x Sk matrix even when causal. The roofline uses the executed FLOPs.",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI glue for ``flashattn io``
# ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flashattn io`` (no GPU needed: everything is counted, nothing is run)."""
    parser.add_argument("--seqlen", type=positive_int, default=None,
                        help="sequence length of queries and keys (required unless both of the next two are given)")
    parser.add_argument("--seqlen-q", type=positive_int, default=None, help="query length (overrides --seqlen)")
    parser.add_argument("--seqlen-k", type=positive_int, default=None, help="key length (overrides --seqlen)")
    parser.add_argument("--head-dim", type=positive_int, default=128, help="default 128")
    parser.add_argument("--heads", type=positive_int, default=16, help="query heads (default 16)")
    parser.add_argument("--kv-heads", type=positive_int, default=None, help="kv heads for GQA (default: --heads)")
    parser.add_argument("--batch", type=positive_int, default=1, help="default 1")
    parser.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bf16", help="default bf16")
    parser.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned when Sq != Sk)")
    parser.add_argument("--gpu", choices=tuple(GPU_PRESETS), default=None,
                        help="measured ceilings: h100 789 TFLOP/s, 3.02 TB/s; h200 788 TFLOP/s, 4.23 TB/s "
                             "(default h200; with --measure, the GPU measured on when it is one of them)")
    parser.add_argument("--peak-tflops", type=positive_float, default=None, help="override the GPU's TFLOP/s")
    parser.add_argument("--bandwidth-tbs", type=positive_float, default=None, help="override the GPU's TB/s")
    parser.add_argument("--block-m", type=positive_int, default=None,
                        help="query tile of every kernel (default: flashattn's Hopper table)")
    parser.add_argument("--block-n", type=positive_int, default=None,
                        help="key tile of every kernel (default: flashattn's Hopper table)")
    parser.add_argument("--sram-kb", type=positive_float, default=HOPPER_SRAM_KB,
                        help=f"SRAM size M for the paper's asymptotic form (default {HOPPER_SRAM_KB}, Hopper's "
                             "shared memory per SM)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    measured = parser.add_argument_group("measurement (needs a CUDA GPU)")
    measured.add_argument("--measure", action="store_true",
                          help="also run the four passes once on this GPU and print the DRAM bytes Nsight "
                               "Compute measures beside the model; where ncu is missing or may not read the "
                               "GPU's counters, kernel times from torch.profiler and the bandwidth the "
                               "model's bytes imply (labelled: not a byte measurement)")
    measured.add_argument("--measure-with", choices=("auto", "ncu", "profiler"), default="auto",
                          help="auto: ncu when found, else (or when it fails) torch.profiler (default auto)")
    measured.add_argument("--ncu", metavar="PATH", default=None,
                          help="the ncu executable (default: ncu on PATH, else $CUDA_HOME/bin/ncu or "
                               "/usr/local/cuda/bin/ncu)")


# The flag each validated field comes from, so that an error names what the user typed.
_FLAGS = {"batch": "--batch", "seqlen_q": "--seqlen-q", "seqlen_k": "--seqlen-k", "heads": "--heads",
          "kv_heads": "--kv-heads", "head_dim": "--head-dim", "block_m": "--block-m", "block_n": "--block-n"}


def _usage_error(flag: str, message: str) -> int:
    print(f"flashattn io: error: argument {flag}: {message}", file=sys.stderr)
    return EXIT_USAGE


def report_from_args(args: argparse.Namespace) -> IoReport:
    """Build the report from parsed options; raises InvalidArgument with the offending field."""
    seqlen_q = args.seqlen_q if args.seqlen_q is not None else args.seqlen
    seqlen_k = args.seqlen_k if args.seqlen_k is not None else args.seqlen
    if seqlen_q is None or seqlen_k is None:
        raise InvalidArgument("seqlen", "required (or both --seqlen-q and --seqlen-k)")
    problem = AttentionProblem(
        batch=args.batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads=args.heads,
        kv_heads=args.heads if args.kv_heads is None else args.kv_heads, head_dim=args.head_dim,
        dtype_bytes=DTYPE_BYTES[args.dtype], causal=args.causal)
    if args.block_m is not None and args.block_n is not None:
        tiling = Tiling.uniform(args.block_m, args.block_n)
    else:
        tiling = Tiling.for_problem(problem).with_overrides(args.block_m, args.block_n)
    return analyze(problem, tiling, gpu_from_args(args), args.sram_kb)


def gpu_from_args(args: argparse.Namespace, default: str = "h200") -> Gpu:
    """The --gpu preset (``default`` when not given), with --peak-tflops / --bandwidth-tbs applied."""
    key = args.gpu or default
    preset = GPU_PRESETS[key]
    custom = args.peak_tflops is not None or args.bandwidth_tbs is not None
    return Gpu(f"{key.upper()} (custom)" if custom else preset.name,
              preset.peak_flops if args.peak_tflops is None else args.peak_tflops * 1e12,
              preset.bandwidth if args.bandwidth_tbs is None else args.bandwidth_tbs * 1e12)


def run(args: argparse.Namespace, measure=None) -> int:
    """Print the table (or JSON); bad values exit 2 naming the flag, as argparse does for bad types."""
    try:
        report = report_from_args(args)
    except InvalidArgument as error:
        flag = _FLAGS.get(error.field, f"--{error.field.replace('_', '-')}")
        if error.field in ("seqlen_q", "seqlen_k") and getattr(args, error.field) is None:
            flag = "--seqlen"
        if error.field == "head_dim" and "table" in error.message:
            return _usage_error(flag, f"{error.message}; pass --block-m and --block-n to model a larger one")
        return _usage_error(flag, error.message)
    if args.measure:
        if args.block_m is not None or args.block_n is not None:
            flag = "--block-m" if args.block_m is not None else "--block-n"
            return _usage_error(flag, "--measure runs the tiles of flashattn's table on this GPU and models "
                                      "those: drop --block-m and --block-n")
        if measure is None:
            return _usage_error("--measure", "run it through `flashattn io` (flashattn.tools.iomeasure.run)")
        return measure(args, report)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flashattn.tools.iomodel``: the same as ``flashattn io`` until the CLI registers it."""
    parser = argparse.ArgumentParser(prog="flashattn io", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
