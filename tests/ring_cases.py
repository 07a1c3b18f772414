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


@dataclass(frozen=True)
class ModuleCase:
    """``flashattn.nn.SelfAttention(process_group=...)`` on the shards of a (batch, seqlen, dim) input against the
    same module on one process: output, input gradient and (summed over the group) weight gradients."""

    seqlen: int
    mode: str = "ring"

    def __str__(self) -> str:
        return f"SelfAttention-N{self.seqlen}-{self.mode}"


@dataclass(frozen=True)
class TrainCase:
    """``benchmarks/train_context_parallel.py``: a few steps on the group and on one process, the same losses."""

    steps: int
    mode: str = "ring"

    def __str__(self) -> str:
        return f"train-{self.steps}-{self.mode}"


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
    if isinstance(case, ModuleCase):
        run_module_case(case, device)
        return
    if isinstance(case, TrainCase):
        run_train_case(case, device)
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


def run_module_case(case: ModuleCase, device: torch.device) -> None:
    import copy

    from flashattn.distributed import shard, shard_positions, unshard
    from flashattn.nn import SelfAttention

    single = SelfAttention(64, num_heads=4, num_kv_heads=2, device=device)
    parallel = copy.deepcopy(single)
    parallel.process_group, parallel.context_parallel_mode = dist.group.WORLD, case.mode
    x = torch.randn(2, case.seqlen, 64, device=device, requires_grad=True)
    out = single(x)
    x_local = shard(x.detach()).requires_grad_()
    positions = shard(torch.arange(case.seqlen, device=device), dim=0)
    assert torch.equal(shard_positions(x_local.shape[1], seqlen=case.seqlen, device=device), positions)
    out_local = parallel(x_local, seqlen=case.seqlen)  # rotary at the global positions of the local tokens
    torch.testing.assert_close(unshard(out_local, seqlen=case.seqlen), out.detach())
    dout = torch.randn_like(out)
    out.backward(dout)
    out_local.backward(shard(dout))
    torch.testing.assert_close(unshard(x_local.grad, seqlen=case.seqlen), x.grad)
    for (name, expected), got in zip(single.named_parameters(), parallel.parameters(), strict=True):
        dist.all_reduce(got.grad)  # each rank's tokens give a part of the weights' gradient
        torch.testing.assert_close(got.grad, expected.grad, msg=lambda m, name=name: f"{name}: {m}")


def run_train_case(case: TrainCase, device: torch.device) -> None:
    from benchmark_scripts import load

    train = load("train_context_parallel").train
    parallel = train(case.steps, dist.group.WORLD, case.mode, device=device, batch=4)
    single = train(case.steps, None, device=device, batch=4)
    torch.testing.assert_close(torch.tensor(parallel), torch.tensor(single), rtol=1e-4, atol=1e-5)


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
    with pytest.raises(ValueError, match="mode must be one of"):
        ring_flash_attn_func(q, q, q, seqlen=4 * world_size + 1, mode="ulysses")
    kv_one = q[:, :, :1]  # one KV head: the all-to-all cannot shard it
    with pytest.raises(ValueError, match=r"mode='all_to_all'.*k.shape\[-2\] = 1"):
        ring_flash_attn_func(q, kv_one, kv_one, seqlen=4 * world_size + 1, mode="all_to_all")
    check_varlen_errors(device)


def check_varlen_errors(device: torch.device) -> None:
    """The packed form's and the module's bad arguments."""
    import pytest

    from flashattn.distributed import ring_flash_attn_varlen_func, shard
    from flashattn.nn import SelfAttention

    world_size = dist.get_world_size()
    cu_seqlens = torch.tensor([0, 5, 5 + 3 * world_size], dtype=torch.int32, device=device)
    q = shard(torch.randn(int(cu_seqlens[-1]), 2, 16, device=device), cu_seqlens=cu_seqlens)
    with pytest.raises(ValueError, match="the packed batch of cu_seqlens_q"):  # the local cu_seqlens, not the whole
        local = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=device)
        ring_flash_attn_varlen_func(q, q, q, local, local, q.shape[0], q.shape[0])
    with pytest.raises(ValueError, match="same tokens as q"):
        other = torch.tensor([0, 6, 5 + 3 * world_size], dtype=torch.int32, device=device)
        ring_flash_attn_varlen_func(q, q, q, cu_seqlens, other, 9, 9)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        ring_flash_attn_varlen_func(q, q, q, cu_seqlens.flip(0), cu_seqlens.flip(0), 9, 9)
    with pytest.raises(ValueError, match="x must hold the whole packed batch"):
        shard(q[:-1], cu_seqlens=cu_seqlens)
    block = SelfAttention(32, 2, process_group=dist.group.WORLD, device=device)
    with pytest.raises(ValueError, match="attention_mask"):
        block(torch.randn(1, 4, 32, device=device), attention_mask=torch.ones(1, 4, dtype=torch.bool, device=device))


# a packed batch whose first sequence is cut over the ranks and whose others stay whole (ring_varlen.place_sequences)
MIXED = (40, 3, 5, 2, 4, 6, 1, 3, 2, 5)


def smoke_cases(world_size: int) -> list[RingCase]:
    """The CI set: every option of the ring once, lengths that 2W does not divide (and W neither), GQA, the three
    dtypes, and the deterministic check; the packed form (sequences shorter than 2W among them), the all-to-all
    mode, ``SelfAttention`` over the group and the training script."""
    if world_size == 2:
        return [
            RingCase(24, (1, 2, 2, 40), "plain", "fp16", packing="kvpacked"),
            RingCase(23, (2, 4, 2, 32), "causal", "bf16"),  # 23 over 2 ranks: 12 and 11 tokens
            RingCase(22, (1, 4, 1, 32), "softcap", "fp32"),  # 22 = 4 x 5 + 2: chunks of 6 and 5
            RingCase(21, (1, 2, 2, 32), "window", "fp32"),
            RingCase(26, (2, 2, 1, 32), "causal-alibi-softcap", "fp16"),
            RingCase(19, (1, 2, 2, 32), "dropout", "fp32"),
            RingCase(20, (1, 2, 1, 32), "window-dropout-scale", "fp32", deterministic=True),
            VarlenRingCase((7, 12, 1, 9), (2, 2, 32), "causal", "fp32"),  # 1 token: three empty chunks
            VarlenRingCase((7, 12, 1, 9), (4, 2, 32), "window-dropout-scale", "fp32"),
            VarlenRingCase((10, 5, 13), (4, 1, 32), "causal-alibi-softcap", "fp16"),
            VarlenRingCase((7, 12, 3, 9), (4, 2, 32), "causal", "bf16", "all_to_all"),
            VarlenRingCase(MIXED, (2, 2, 32), "causal", "bf16"),  # one sequence cut, the others whole
            VarlenRingCase(MIXED, (4, 2, 32), "window-dropout-scale", "fp32"),
            VarlenRingCase(MIXED, (4, 2, 32), "causal", "fp16", "all_to_all"),
            VarlenRingCase((2,) * 20, (2, 1, 32), "causal-alibi-softcap", "fp32"),  # every sequence whole: no ring
            VarlenRingCase((1,), (2, 2, 32), "causal", "fp32"),  # rank 1 holds no token at all
            RingCase(21, (2, 4, 2, 32), "window-dropout-scale", "fp32", mode="all_to_all"),
            RingCase(22, (2, 2, 2, 40), "causal-alibi-softcap", "fp16", packing="kvpacked", mode="auto"),
            ModuleCase(23),
            TrainCase(3),
        ]
    return [  # 4 ranks and more: what 2 ranks cannot show (a chunk between two others, 2W >= 8 chunks)
        RingCase(37, (1, 4, 2, 32), "causal", "fp32"),  # 37 over 4 ranks: 10, 9, 9, 9 tokens
        RingCase(28, (1, 2, 2, 32), "causal", "fp32", packing="qkvpacked"),
        RingCase(30, (1, 2, 1, 40), "window-left", "fp32"),
        RingCase(33, (1, 2, 2, 32), "dropout", "fp32"),
        VarlenRingCase((3, 17, 9), (2, 2, 32), "causal", "fp32"),  # 3 tokens over 8 chunks
        VarlenRingCase((*MIXED, 4, 3), (2, 2, 32), "causal", "fp32"),  # whole sequences on every rank
        VarlenRingCase((3,) + (1,) * 23, (2, 2, 32), "causal", "fp32"),  # one rank sends nothing: empty transfers
        RingCase(30, (1, 2 * world_size, world_size, 32), "causal", "bf16", mode="all_to_all"),
    ]


def full_cases(world_size: int) -> list[RingCase]:
    """On demand (FLASHATTN_RING_FULL=1): every OPTIONS entry in every dtype, at a length 2W divides and at one
    that W does not; packed batches by the ring and by the all-to-all (heads that W divides) likewise."""
    even = 8 * world_size
    odd = even + world_size // 2 + 1
    packed = (even, 1, odd, 2 * world_size - 1)
    heads = (2 * world_size, world_size, 40)  # the all-to-all's: W divides the KV heads
    return [RingCase(seqlen, (2, 4, 2, 40), option, dtype)
            for option in OPTIONS for dtype in DTYPES for seqlen in (even, odd)] + [
        case for option in OPTIONS for dtype in DTYPES for case in (
            VarlenRingCase(packed, (4, 2, 40), option, dtype),
            VarlenRingCase(packed, heads, option, dtype, "all_to_all"),
            RingCase(odd, (2, *heads), option, dtype, mode="all_to_all"))] + [
        ModuleCase(odd), ModuleCase(even, "auto"), TrainCase(5, "auto")]


def gpu_cases(world_size: int) -> list[RingCase]:
    """NCCL on GPUs, at real sizes: bf16 (and fp16), head dim 128, GQA, 4k-8k tokens, lengths 2W may not divide;
    packed batches and the all-to-all mode (on KV heads that W divides)."""
    shape = (1, 8, 2, 128)
    kv_heads = max(4, world_size)
    return [RingCase(8192, shape, option, "bf16") for option in OPTIONS] + [
        RingCase(8190, shape, "causal", "fp16"),
        RingCase(4099, (2, 4, 4, 64), "causal", "bf16"),
        RingCase(4096, shape, "window-dropout-scale", "bf16", deterministic=True),
        VarlenRingCase((4096, 1000, 3001), (8, 2, 128), "causal", "bf16"),
        VarlenRingCase((4096, 1000, 3001), (8, 2, 128), "window-dropout-scale", "bf16"),
        VarlenRingCase((4096, 1000, 3001), (2 * kv_heads, kv_heads, 128), "causal", "bf16", "all_to_all"),
        RingCase(8190, (1, 2 * kv_heads, kv_heads, 128), "causal", "bf16", mode="all_to_all"),
        RingCase(4096, (2, 2 * kv_heads, kv_heads, 128), "window-dropout-scale", "bf16", mode="all_to_all"),
    ]


def spawn(world_size: int, backend: str, cases: list[RingCase], store_dir: str) -> None:
    """Run ``cases`` on a fresh group of ``world_size`` processes; raises the first failure of any rank."""
    import torch.multiprocessing as mp

    store_path = os.path.join(store_dir, f"store-{backend}-{world_size}")
    mp.start_processes(run_group, args=(world_size, store_path, backend, cases), nprocs=world_size,
                       start_method="spawn")
