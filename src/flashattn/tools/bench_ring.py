"""ring attention's scaling on W devices against one: ``torchrun --nproc-per-node W -m flashattn ring``.

Every rank joins the default process group (NCCL on GPUs, gloo on CPUs; torchrun's environment). For each total
sequence length and mask, rank 0 first times ``flash_attn_func`` forward + backward on the whole sequence alone
(the 1-device reference, the others waiting), then all ranks time ``ring_flash_attn_func`` forward + backward on
their zigzag shards of the same sequence in each ``--mode`` (``ring``: provider ``flashattn_ring``; ``all_to_all``,
the head-parallel exchange: ``flashattn_all_to_all``), and optionally torch's ``context_parallel`` on the same
shapes (``--torch-cp``). Reported per case: milliseconds, TFLOP/s per device (the full problem's FLOPs by the convention
of ``flops.py``, forward + backward = 3.5 x forward, over the time and the W devices), the ring's scaling
efficiency (its TFLOP/s per device over the 1-device call's) and the peak memory a device allocated above its
inputs.

All ranks run the same number of iterations (rank 0 picks it from a warm-up and broadcasts it), each timed between
barriers; a case's time is the median iteration of the slowest rank. torch's context parallelism is skipped above
``--torch-cp-max-seqlen`` and, once a call of it takes more than ``--torch-cp-timeout`` seconds, at every longer
length: those rows say why instead of a time.

A provider's first case of each mask starts with one more, untimed call: the first call of a process compiles
the kernels and sets up NCCL's connections (seconds, enough to pass for a long case below). A case whose warm-up call
takes longer than ``--single-call-seconds`` (the longest sequences) is measured by that call alone, unless the call
took more than ``RECOMPILED`` times what the provider's rate on its previous case predicts: a new length can still
compile kernel variants (tile choices depend on the length) and grow the allocator's pools, and then one more call is
the measurement.

``--packed``: each total length is a packed batch of documents instead of one sequence (``document_lengths``: a
seeded lognormal draw, mean 4k tokens, capped at 64k), timed with ``flash_attn_varlen_func`` on one device against
``ring_flash_attn_varlen_func`` on every rank's part of the batch (``shard`` with cu_seqlens: short documents
whole on one rank, long ones cut); the FLOPs are the documents' own.

Results go to ``<machine>x<W>-ring.json`` in ``--out`` (``h200x2-ring.json``; ``-ring_varlen.json`` with
``--packed``), with the environment of ``flashattn bench``, rewritten after every case: a run cut short keeps what
it measured.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from .. import flops
from .units import EXIT_USAGE, positive_int, positive_int_list

MODES = {"ring": "flashattn_ring", "all_to_all": "flashattn_all_to_all"}  # mode -> provider
GPU_SEQLENS = (8192, 16384, 32768, 65536, 131072, 262144, 524288)
# a long warm-up call slower than this times the predicted seconds paid for one-time work: one more call is timed.
# A longer case's rate is at least its predecessor's, so an honest call stays under it.
RECOMPILED = 1.2
GPU_CAUSAL_ONLY_SEQLENS = (1048576,)  # a million tokens: causal only (the non-causal call takes twice as long)
CPU_SEQLENS = (256, 512)
GPU_PACKED_SEQLENS = (262144,)
CPU_PACKED_SEQLENS = (512,)
# packed batches: document lengths lognormal with this mean (sigma 1: a long tail), capped; the last is cut to fit
DOCUMENT_MEAN, DOCUMENT_SIGMA, DOCUMENT_CAP = 4096, 1.0, 65536


@dataclass(frozen=True)
class RingCase:
    seqlen: int  # the whole sequence's tokens
    causal: bool
    batch: int
    nheads: int
    nheads_k: int
    head_dim: int
    dtype: str
    world_size: int
    documents: tuple[int, ...] | None = None  # a packed batch's document lengths (summing to seqlen); None: dense

    def flops(self) -> float:
        """Forward + backward FLOPs of the whole problem (``flops.py``): of each document, for a packed batch."""
        total = 0.0
        for length in self.documents or (self.seqlen,):
            total += (flops.forward_flops(self.batch, length, length, self.nheads, self.head_dim, self.causal)
                      + flops.backward_flops(self.batch, length, length, self.nheads, self.head_dim, self.causal))
        return total


def document_lengths(total: int, mean: int = DOCUMENT_MEAN, cap: int = DOCUMENT_CAP) -> tuple[int, ...]:
    """Lengths of documents packed into ``total`` tokens: lognormal draws (``DOCUMENT_SIGMA``, scaled to ``mean``),
    each at least 1 and at most ``cap`` tokens, the last cut to fill ``total`` exactly; seeded by ``total``."""
    generator = torch.Generator().manual_seed(total)
    mu = math.log(mean) - DOCUMENT_SIGMA ** 2 / 2
    lengths: list[int] = []
    while sum(lengths) < total:
        draw = math.exp(mu + DOCUMENT_SIGMA * torch.randn((), generator=generator).item())
        lengths.append(min(max(1, round(draw)), cap, total - sum(lengths)))
    return tuple(lengths)


@dataclass
class RingMeasurement:
    provider: str  # "flashattn" (one device, the whole sequence), "flashattn_ring", "flashattn_all_to_all", "torch_cp"
    case: RingCase
    devices: int
    ms: float | None = None
    tflops_per_device: float | None = None
    efficiency: float | None = None  # TFLOP/s per device over the 1-device call's
    peak_mib: float | None = None
    iterations: int | None = None
    spread: float | None = None  # the slowest rank's interquartile range over its median
    error: str | None = None
    extra: dict = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqlens", type=positive_int_list, nargs="+", default=None, metavar="N",
                        help="total tokens of the sequence (default: 8k .. 512k on GPUs, and 1M causal; 256 512 on "
                             "CPUs; packed: 256k on GPUs, 512 on CPUs)")
    parser.add_argument("--causal", choices=("yes", "no", "both"), default="both")
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--heads", type=positive_int, default=32, help="query heads (default 32)")
    parser.add_argument("--kv-heads", type=positive_int, default=8, help="key/value heads (default 8)")
    parser.add_argument("--head-dim", type=positive_int, default=128)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default: bfloat16 on GPUs, float32 on CPUs")
    parser.add_argument("--target-seconds", type=float, default=2.0,
                        help="time each case for about this long (at least --min-iters iterations)")
    parser.add_argument("--min-iters", type=positive_int, default=3)
    parser.add_argument("--single-call-seconds", type=float, default=3.0,
                        help="a case whose warm-up call takes longer is measured by that call alone")
    parser.add_argument("--packed", action="store_true",
                        help="packed batches of documents (varlen) instead of one sequence each")
    parser.add_argument("--mode", nargs="+", choices=MODES, default=["ring"],
                        help="the modes of ring_flash_attn_func to time, each a provider (default: ring)")
    parser.add_argument("--no-single", action="store_true", help="skip the 1-device reference")
    parser.add_argument("--torch-cp", action="store_true",
                        help="also time torch's context_parallel (torch.distributed.tensor.experimental)")
    parser.add_argument("--torch-cp-max-seqlen", type=positive_int, default=65536)
    parser.add_argument("--torch-cp-timeout", type=float, default=60.0,
                        help="seconds a torch context_parallel call may take before longer lengths are skipped")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder of the results file (default: .)")


def run(args: argparse.Namespace) -> int:
    if "RANK" not in os.environ:
        print("flashattn ring: run it under torchrun, one process a device: "
              "torchrun --nproc-per-node 2 -m flashattn ring ...", file=sys.stderr)
        return EXIT_USAGE
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        mode = "ring_varlen" if args.packed else "ring"
        rows = run_cases(args, device, lambda rows: _write(args.out, rows, mode) if dist.get_rank() == 0 else None)
        if dist.get_rank() == 0:
            print(f"results: {_write(args.out, rows, mode)}")
        # every rank past its work before any tears its group down: a gloo teardown while a peer is still at work can
        # abort the process ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if not cuda:
        # past this point a gloo rank can still abort in the interpreter's teardown ("terminate called without an
        # active exception", in a few % of two-process all-to-all runs on a busy CPU), after every result is written,
        # and torchrun reports the run as failed: the ranks leave without that teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def default_seqlens(device: torch.device, causal: bool, packed: bool) -> list[int]:
    gpu = device.type == "cuda"
    if packed:
        return list(GPU_PACKED_SEQLENS if gpu else CPU_PACKED_SEQLENS)
    if not gpu:
        return list(CPU_SEQLENS)
    return list(GPU_SEQLENS) + (list(GPU_CAUSAL_ONLY_SEQLENS) if causal else [])


def run_cases(args: argparse.Namespace, device: torch.device, written: Callable[[list], None] = lambda rows: None
              ) -> list[RingMeasurement]:
    """Every case's rows; ``written(rows)`` after each case."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    masks = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    single_build, ring_build = (_single_varlen_call, _ring_varlen_call) if args.packed else (_single_call, _ring_call)
    rows: list[RingMeasurement] = []
    torch_cp_stopped: str | None = None
    seconds_per_flop: dict[tuple[str, bool], float] = {}  # (provider, causal) -> its last case's rate

    def measure(case: RingCase, provider: str, build, **options) -> RingMeasurement:
        key = (provider, case.causal)
        rate = seconds_per_flop.get(key)
        measured = _measure(case, provider, build, device, args, first_call=rate is None,
                            predicted=None if rate is None else rate * case.flops(), **options)
        if measured.ms:
            seconds_per_flop[key] = measured.ms / 1e3 / case.flops()
        return measured
    for causal in masks:
        seqlens = ([n for group in args.seqlens for n in group] if args.seqlens
                   else default_seqlens(device, causal, args.packed))
        for seqlen in seqlens:
            case = RingCase(seqlen, causal, args.batch, args.heads, args.kv_heads, args.head_dim, dtype, world_size,
                            document_lengths(seqlen) if args.packed else None)
            first = len(rows)
            single = None
            if not args.no_single:
                single = measure(case, "flashattn", single_build, only_rank0=True)
                rows.append(single)
            for mode in dict.fromkeys(args.mode):
                ring = measure(case, MODES[mode], functools.partial(ring_build, mode=mode))
                rows.append(ring)
                if single is not None and single.tflops_per_device and ring.tflops_per_device:
                    ring.efficiency = ring.tflops_per_device / single.tflops_per_device
            if args.torch_cp and not args.packed:
                skip = torch_cp_stopped
                if seqlen > args.torch_cp_max_seqlen:
                    skip = f"n/a: not run above --torch-cp-max-seqlen {args.torch_cp_max_seqlen}"
                if skip:
                    rows.append(RingMeasurement("torch_cp", case, world_size, error=skip))
                else:
                    measured = measure(case, "torch_cp", _torch_cp_call, timeout=args.torch_cp_timeout)
                    if single is not None and single.tflops_per_device and measured.tflops_per_device:
                        measured.efficiency = measured.tflops_per_device / single.tflops_per_device
                    rows.append(measured)
                    if measured.extra.get("timed_out"):
                        torch_cp_stopped = (f"n/a: a call took more than --torch-cp-timeout {args.torch_cp_timeout} s "
                                            "at a shorter length")
            if rank == 0:
                _print_rows(rows[first:])
            written(rows)
    return rows


# -- the providers: each builds, from the full q, k, v on every rank, a zero-argument fwd + bwd call --------------


def _inputs(case: RingCase, device: torch.device, requires_grad: bool = True):
    generator = torch.Generator(device=device).manual_seed(case.seqlen)
    dtype = getattr(torch, case.dtype)

    def tensor(heads):
        x = torch.randn(case.batch, case.seqlen, heads, case.head_dim, device=device, dtype=dtype,
                        generator=generator)
        return x.requires_grad_(requires_grad)

    return tensor(case.nheads), tensor(case.nheads_k), tensor(case.nheads_k)


def _single_call(case: RingCase, device: torch.device) -> Callable[[], object]:
    from ..interface import flash_attn_func

    q, k, v = _inputs(case, device)
    dout = torch.randn_like(q)

    def call():
        out = flash_attn_func(q, k, v, causal=case.causal)
        return torch.autograd.grad(out, (q, k, v), dout)

    return call


def _ring_call(case: RingCase, device: torch.device, mode: str = "ring") -> Callable[[], object]:
    from ..distributed import ring_flash_attn_func, shard

    q, k, v = (shard(x.detach()).requires_grad_() for x in _inputs(case, device, requires_grad=False))
    dout = torch.randn_like(q)

    def call():
        out = ring_flash_attn_func(q, k, v, causal=case.causal, seqlen=case.seqlen, mode=mode)
        return torch.autograd.grad(out, (q, k, v), dout)

    return call


def _packed_inputs(case: RingCase, device: torch.device):
    """The packed batch's (total, heads, head_dim) q, k, v (no grad), its cu_seqlens (int32) and longest document."""
    q, k, v = (x[0] for x in _inputs(case, device, requires_grad=False))
    lengths = torch.tensor((0, *case.documents), device=device)
    cu_seqlens = torch.cumsum(lengths, 0, dtype=torch.int32)
    return q, k, v, cu_seqlens, max(case.documents)


def _single_varlen_call(case: RingCase, device: torch.device) -> Callable[[], object]:
    from ..varlen import flash_attn_varlen_func

    q, k, v, cu_seqlens, longest = _packed_inputs(case, device)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    dout = torch.randn_like(q)

    def call():
        out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=case.causal)
        return torch.autograd.grad(out, (q, k, v), dout)

    return call


def _ring_varlen_call(case: RingCase, device: torch.device, mode: str = "ring") -> Callable[[], object]:
    from ..distributed import ring_flash_attn_varlen_func, shard

    q, k, v, cu_seqlens, longest = _packed_inputs(case, device)
    q, k, v = (shard(x, cu_seqlens=cu_seqlens).requires_grad_() for x in (q, k, v))
    dout = torch.randn_like(q)

    def call():
        out = ring_flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=case.causal,
                                          mode=mode)
        return torch.autograd.grad(out, (q, k, v), dout)

    return call


@functools.cache
def _device_mesh(device_type: str, world_size: int):
    """One mesh over all ranks for the whole run, on a process group of its own: a call of torch's that fails midway
    may leave messages in flight, which must not meet the ring's on the default group."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dist.new_group(list(range(world_size))), device_type)


def _torch_cp_call(case: RingCase, device: torch.device) -> Callable[[], object]:
    """torch's context parallelism: SDPA inside ``context_parallel``, which shards the buffers along the sequence
    (its default load balancing) and runs SDPA as ring attention. K/V heads are repeated to q's: GQA inside the
    context is not taken by every torch version."""
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel

    if device.type != "cuda":
        raise NotImplementedError("n/a: torch's context_parallel shards only the GPU attention kernels")
    mesh = _device_mesh(device.type, dist.get_world_size())
    q, k, v = (x.detach().transpose(1, 2).contiguous() for x in _inputs(case, device, requires_grad=False))
    group = case.nheads // case.nheads_k
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    buffers = [q, k, v]
    context = context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2])
    context.__enter__()  # shards the buffers in place; held for the timing, left at the end of the case
    q, k, v = (x.requires_grad_() for x in buffers)
    dout = torch.randn_like(q)

    def call():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
        return torch.autograd.grad(out, (q, k, v), dout)

    def close():
        for buffer in buffers:  # the context restores them in place, which tensors that require grad refuse
            buffer.requires_grad_(False)
        context.__exit__(None, None, None)

    call.close = close
    return call


# -- timing: every rank the same iterations, between barriers ------------------------------------------------------


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _broadcast_int(value: int, device: torch.device) -> int:
    holder = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(holder, 0)
    return int(holder.item())


def _max_over_ranks(value: float, device: torch.device) -> float:
    holder = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(holder, op=dist.ReduceOp.MAX)
    return float(holder.item())


def _timed(call: Callable[[], object], device: torch.device, group: bool) -> float:
    """Seconds of one call, the ranks started together (``group``) and the device drained."""
    if group:
        dist.barrier()
    _synchronize(device)
    start = time.perf_counter()
    call()
    _synchronize(device)
    return time.perf_counter() - start


def _measure(case: RingCase, provider: str, build, device: torch.device, args: argparse.Namespace,
             only_rank0: bool = False, timeout: float | None = None, first_call: bool = False,
             predicted: float | None = None) -> RingMeasurement:
    """Time ``build(case, device)()`` on every rank (on rank 0 alone when ``only_rank0``: the others wait at a
    barrier), after one untimed call when it is the provider's ``first_call`` in the process. A long warm-up call
    is the measurement, unless it took more than ``RECOMPILED`` times the ``predicted`` seconds (the provider's rate
    on its previous case): then it compiled kernels or grew memory pools for this length, and one more call is
    timed. A provider that fails on a case is reported, not fatal."""
    devices = 1 if only_rank0 else dist.get_world_size()
    measurement = RingMeasurement(provider, case, devices)
    runs_here = dist.get_rank() == 0 or not only_rank0
    call, first, peak, error = None, 0.0, 0.0, None
    if runs_here:
        try:
            call = build(case, device)
            if first_call:
                _timed(call, device, group=not only_rank0)
            baseline = _reset_peak(device)
            first = _timed(call, device, group=not only_rank0)  # warm-up: compiles, communicators, allocations
            peak = _peak_mib(device, baseline)
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}".splitlines()[0][:300]
    if _max_over_ranks(1.0 if error else 0.0, device) > 0:
        measurement.error = error or "n/a: failed on another rank"
        _close(call)
        return measurement
    slowest_first = _max_over_ranks(first, device)
    timed_out = timeout is not None and slowest_first > timeout
    one_call = timed_out or slowest_first > args.single_call_seconds  # the warm-up call is the measurement
    iterations = 1 if one_call else _broadcast_int(max(args.min_iters, int(args.target_seconds / max(first, 1e-6))),
                                                   device)
    if one_call and not timed_out and predicted is not None and slowest_first > RECOMPILED * predicted:
        first = _timed(call, device, group=not only_rank0) if runs_here else 0.0
        slowest_first = _max_over_ranks(first, device)
    seconds = [first]
    if runs_here and not one_call:
        seconds = [_timed(call, device, group=not only_rank0) for _ in range(iterations)]
    if only_rank0:
        dist.barrier()
    _close(call)
    median = statistics.median(seconds)
    slowest = _max_over_ranks(median if runs_here else 0.0, device)
    measurement.ms = slowest * 1e3
    measurement.iterations = len(seconds)
    measurement.tflops_per_device = case.flops() / slowest / devices / 1e12 if slowest > 0 else None
    measurement.peak_mib = _max_over_ranks(peak, device)
    if len(seconds) >= 4:
        quartiles = statistics.quantiles(seconds, n=4)
        measurement.spread = (quartiles[2] - quartiles[0]) / median if median else 0.0
    if timed_out:
        measurement.extra["timed_out"] = True
    elif one_call:
        measurement.extra["one_call"] = True
    return measurement


def _close(call) -> None:
    close = getattr(call, "close", None)
    if close is not None:
        close()


def _reset_peak(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak_mib(device: torch.device, baseline: float) -> float:
    """Peak bytes allocated above ``baseline`` (the inputs), in MiB; 0 on CPUs, whose allocator keeps no counter."""
    if device.type != "cuda":
        return 0.0
    return (torch.cuda.max_memory_allocated(device) - baseline) / 2**20


# -- output -------------------------------------------------------------------------------------------------------


def _print_rows(rows: list[RingMeasurement]) -> None:
    for row in rows:
        case = row.case
        mask = "causal" if case.causal else "full"
        if row.error:
            print(f"{case.seqlen:>8} {mask:>6} {row.provider:<15} {row.error}", flush=True)
            continue
        efficiency = f"{row.efficiency:6.1%}" if row.efficiency is not None else "     -"
        print(f"{case.seqlen:>8} {mask:>6} {row.provider:<15} {row.devices} dev {row.ms:10.2f} ms "
              f"{row.tflops_per_device:8.1f} TFLOP/s/dev  eff {efficiency}  peak {row.peak_mib:9.0f} MiB",
              flush=True)


def _write(folder: Path, rows: list[RingMeasurement], mode: str) -> Path:
    from .bench import environment
    from .results import machine_kind, write_results

    env = environment()
    world_size = dist.get_world_size()
    env.update(world_size=world_size, backend=dist.get_backend())
    return write_results(folder, env, mode, [asdict(r) for r in rows],
                         machine=f"{machine_kind(env)}x{world_size}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="flashattn ring", description=__doc__.strip().splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
