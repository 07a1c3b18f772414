"""Ring attention's cases, run inside processes that a test spawns (``test_distributed.py``).

Each process joins a process group (gloo on CPUs, NCCL on GPUs) and runs a whole list of cases, so that the cost
of starting a process (importing torch) is paid once per group size. A case shards full random inputs with
``shard``, runs ``ring_flash_attn_func`` on every rank, gathers the results with ``unshard`` and holds them to
flash-attn's rule against the float64 reference on the full sequence (``flashattn.testing``): output, lse and every
gradient, on every rank.
"""

from __future__ import annotations

import datetime
import os
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist
from cases import OPTIONS, make_case, make_varlen_case

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class RingCase:
    """A full sequence of ``seqlen`` tokens over the group, (batch, nheads, nheads_k, head_dim), an OPTIONS name
    and a dtype name; ``deterministic``: run it twice and compare the gradients bitwise instead."""

    seqlen: int
    shape: tuple[int, int, int, int]
    option: str
    dtype: str
    deterministic: bool = False
    packing: str = "separate"  # or "kvpacked", "qkvpacked": which of the three functions runs
    mode: str = "ring"  # or "all_to_all", "auto"

    def __str__(self) -> str:
        batch, nheads, nheads_k, head_dim = self.shape
        kind = "-deterministic" if self.deterministic else ""
        packing = "" if self.packing == "separate" else f"-{self.packing}"
        mode = "" if self.mode == "ring" else f"-{self.mode}"
        return (f"N{self.seqlen}-b{batch}-h{nheads}/{nheads_k}-d{head_dim}-{self.option}-{self.dtype}{kind}"
                f"{packing}{mode}")


@dataclass(frozen=True)
class VarlenRingCase:
    """A packed batch of sequences of ``seqlens`` tokens over the group (``ring_flash_attn_varlen_func``),
    (nheads, nheads_k, head_dim), an OPTIONS name, a dtype name and a mode."""

    seqlens: tuple[int, ...]
    shape: tuple[int, int, int]
    option: str
    dtype: str
    mode: str = "ring"

    def __str__(self) -> str:
        nheads, nheads_k, head_dim = self.shape
        return (f"varlen{'/'.join(map(str, self.seqlens))}-h{nheads}/{nheads_k}-d{head_dim}-{self.option}-"
                f"{self.dtype}-{self.mode}")


def run_group(rank: int, world_size: int, store_path: str, backend: str, cases: list[RingCase]) -> None:
    """One rank's part: join the group and run every case; raise on the first failure, naming the case."""
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    try:
        check_errors(device)
        for case in cases:
            try:
                run_case(case, device)
            except Exception as error:
                raise AssertionError(f"rank {rank} of {world_size}, case {case}:\n{traceback.format_exc()}") from error
    finally:
        dist.destroy_process_group()


def run_case(case: RingCase, device: torch.device) -> None:
    import zlib

    from flashattn import testing

    torch.manual_seed(zlib.crc32(str(case).encode()))  # the same inputs on every rank
    if isinstance(case, VarlenRingCase):
        run_varlen_case(case, device)
        return
    batch, nheads, nheads_k, head_dim = case.shape
    attention = make_case((batch, case.seqlen, case.seqlen, nheads, nheads_k, head_dim), case.option, device)
    dtype = DTYPES[case.dtype]
    if case.deterministic:
        check_deterministic(attention, dtype, device)
    else:
        testing.check_run_against_reference(attention, dtype, device, ring_run(case.seqlen, case.packing, case.mode))


def run_varlen_case(case: VarlenRingCase, device: torch.device) -> None:
    """Shard a packed batch by its cu_seqlens, run ``ring_flash_attn_varlen_func``, gather, and hold the results
    to the rule against the per-sequence float64 reference on the whole batch."""
    import functools

    from flashattn import testing
    from flashattn.distributed import ring_flash_attn_varlen_func, shard, unshard
    from flashattn.reference import varlen_attention_ref

    attention = make_varlen_case((case.seqlens, case.seqlens, *case.shape), case.option, device)
    cu_seqlens, _ = attention.cu_seqlens(device)
    longest = max(case.seqlens)

    def run(q, k, v, options):
        q_local, k_local, v_local = (shard(x, cu_seqlens=cu_seqlens).requires_grad_() for x in (q, k, v))
        out, lse, _ = ring_flash_attn_varlen_func(q_local, k_local, v_local, cu_seqlens, cu_seqlens, longest, longest,
                                                  **options, return_attn_probs=True, mode=case.mode)

        def gradients(dout):
            grads = torch.autograd.grad(out, (q_local, k_local, v_local), shard(dout, cu_seqlens=cu_seqlens))
            return tuple(unshard(g, cu_seqlens=cu_seqlens) for g in grads)

        return unshard(out.detach(), cu_seqlens=cu_seqlens), unshard(lse, dim=1, cu_seqlens=cu_seqlens), gradients

    reference_fn = functools.partial(varlen_attention_ref, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens)
    dtype = DTYPES[case.dtype]
    testing.check_run_against_reference(attention, dtype, device, run, inputs=attention.random_inputs(dtype, device),
                                        reference_fn=reference_fn)


def ring_run(seqlen: int, packing: str = "separate", mode: str = "ring"):
    """``run`` for ``check_run_against_reference``: shard, the ring (or ``mode``), unshard. ``packing``: "separate",
    "kvpacked" or "qkvpacked": which of the three functions runs."""
    from flashattn.distributed import (
        ring_flash_attn_func,
        ring_flash_attn_kvpacked_func,
        ring_flash_attn_qkvpacked_func,
        shard,
        unshard,
    )

    def run(q, k, v, options):
        q_local, k_local, v_local = (shard(x).requires_grad_() for x in (q, k, v))
        kwargs = dict(options, return_attn_probs=True, seqlen=seqlen, mode=mode)
        if packing == "kvpacked":
            kv = torch.stack((k_local, v_local), dim=2)
            out, lse, _ = ring_flash_attn_kvpacked_func(q_local, kv, **kwargs)
        elif packing == "qkvpacked":
            qkv = torch.stack((q_local, k_local, v_local), dim=2)
            out, lse, _ = ring_flash_attn_qkvpacked_func(qkv, **kwargs)
        else:
            out, lse, _ = ring_flash_attn_func(q_local, k_local, v_local, **kwargs)

        def gradients(dout):
            grads = torch.autograd.grad(out, (q_local, k_local, v_local), shard(dout))
            return tuple(unshard(g, seqlen=seqlen) for g in grads)

        return unshard(out.detach(), seqlen=seqlen), unshard(lse, dim=2, seqlen=seqlen), gradients

    return run


def check_deterministic(attention, dtype: torch.dtype, device: torch.device) -> None:
    """Two runs of the same inputs (and dropout seed) give bitwise the same output and gradients on every rank."""
    from flashattn import testing

    q, k, v = testing.random_inputs(attention, dtype, device)
    dout = torch.randn_like(q)
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        out, _, gradients = ring_run(attention.seqlen_q)(q, k, v, dict(attention.options, deterministic=True))
        results.append((out, *gradients(dout)))
    for name, first, second in zip(("out", "dq", "dk", "dv"), *results, strict=True):
        assert torch.equal(first, second), f"{name} differs between two runs: {(first - second).abs().max()}"


def check_errors(device: torch.device) -> None:
    """Bad calls raise naming the argument, on every rank alike (no rank is left waiting in a collective)."""
    import pytest

    from flashattn.distributed import ring_flash_attn_func, shard

    world_size = dist.get_world_size()
    q = shard(torch.randn(1, 4 * world_size + 1, 2, 16, device=device))
    with pytest.raises(ValueError, match="seqlen"):  # W more tokens: one more on every rank
        ring_flash_attn_func(q, q, q, seqlen=5 * world_size + 1)
    with pytest.raises(ValueError, match="same tokens as q"):
        ring_flash_attn_func(q, q[:, 1:], q[:, 1:], seqlen=4 * world_size + 1)
    with pytest.raises(TypeError, match="seqlen"):
        ring_flash_attn_func(q, q, q, seqlen=2.5)


def smoke_cases(world_size: int) -> list[RingCase]:
    """The CI set: every option of the ring once, lengths that 2W does not divide (and W neither), GQA, the three
    dtypes, and the deterministic check."""
    if world_size == 2:
        return [
            RingCase(24, (2, 4, 2, 32), "causal", "fp32"),
            RingCase(24, (1, 2, 2, 40), "plain", "fp16", packing="kvpacked"),
            RingCase(23, (1, 2, 2, 32), "causal", "bf16"),  # 23 over 2 ranks: 12 and 11 tokens
            RingCase(22, (1, 4, 1, 32), "softcap", "fp32"),  # 22 = 4 x 5 + 2: chunks of 6 and 5
            RingCase(21, (1, 2, 2, 32), "window", "fp32"),
            RingCase(26, (2, 2, 1, 32), "causal-alibi-softcap", "fp16"),
            RingCase(19, (1, 2, 2, 32), "dropout", "fp32"),
            RingCase(25, (1, 4, 2, 32), "window-dropout-scale", "bf16"),
            RingCase(20, (1, 2, 1, 32), "window-dropout-scale", "fp32", deterministic=True),
        ]
    return [
        RingCase(37, (1, 4, 2, 32), "causal", "fp32"),  # 37 over 4 ranks: 10, 9, 9, 9 tokens
        RingCase(28, (1, 2, 2, 32), "causal", "fp32", packing="qkvpacked"),
        RingCase(32, (1, 2, 2, 32), "plain", "bf16"),
        RingCase(30, (1, 2, 1, 40), "window-left", "fp32"),
        RingCase(35, (2, 2, 2, 32), "causal-alibi-softcap", "fp16"),
        RingCase(33, (1, 2, 2, 32), "dropout", "fp32"),
        RingCase(29, (1, 2, 1, 32), "causal", "fp32", deterministic=True),
    ]


def full_cases(world_size: int) -> list[RingCase]:
    """On demand (FLASHATTN_RING_FULL=1): every OPTIONS entry in every dtype, at a length 2W divides and at one
    that W does not."""
    even = 8 * world_size
    return [RingCase(seqlen, (2, 4, 2, 40), option, dtype)
            for option in OPTIONS for dtype in DTYPES for seqlen in (even, even + world_size // 2 + 1)]


def gpu_cases() -> list[RingCase]:
    """NCCL on GPUs, at real sizes: bf16 (and fp16), head dim 128, GQA, 4k-8k tokens, lengths 2W may not divide."""
    shape = (1, 8, 2, 128)
    return [RingCase(8192, shape, option, "bf16") for option in OPTIONS] + [
        RingCase(8190, shape, "causal", "fp16"),
        RingCase(4099, (2, 4, 4, 64), "causal", "bf16"),
        RingCase(4096, shape, "window-dropout-scale", "bf16", deterministic=True),
    ]


def spawn(world_size: int, backend: str, cases: list[RingCase], store_dir: str) -> None:
    """Run ``cases`` on a fresh group of ``world_size`` processes; raises the first failure of any rank."""
    import torch.multiprocessing as mp

    store_path = os.path.join(store_dir, f"store-{backend}-{world_size}")
    mp.start_processes(run_group, args=(world_size, store_path, backend, cases), nprocs=world_size,
                       start_method="spawn")
