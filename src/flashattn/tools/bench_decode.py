"""Decode benchmark (``flashattn bench --mode decode``): one new token per sequence over a KV cache.

Each case is a decode step: append one key/value per sequence into a cache that then holds
``cache_len`` keys, and attend to them with one query token per head (GQA 32 query / 8 kv heads, head
dim 128, bfloat16 by default), with a contiguous and with a paged cache. Decoding is bound by reading
the cache, so the figure of merit is the achieved bandwidth: K/V bytes read / time. It is reported next
to torch SDPA on the same shapes (its fastest backend, on the contiguous cache, no append) and to the
device's measured copy bandwidth. ``flashattn_noappend`` times flashattn's attention alone, without the
append, as SDPA runs it.

Timing: the calls are captured in a CUDA graph and replayed, so that Python's per-call overhead (tens
of microseconds, more than the kernels of the small cases take) is not what is measured; when the
cache is smaller than 4x the L2 cache, the graph cycles over enough copies of it that every call reads
from HBM. Each step is also timed called eagerly, back to back (``eager_us``): what a serving loop without
CUDA graphs sees, the host's time per call wherever that exceeds the GPU's. Without a GPU a small grid
runs with plain wall-clock timing, to exercise the code.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..kvcache import flash_attn_with_kvcache
from . import results
from .timing import Timing, median_seconds, time_call, time_loop

Runner = Callable[[int], object]  # runs one decode step on cache copy i


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    cache_len: int  # keys each sequence attends to (the appended one included)
    page_size: int | None = None  # None: contiguous cache
    nheads: int = 32
    nheads_k: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"

    def kv_bytes(self) -> int:
        """Bytes of K and V one step reads."""
        element = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return 2 * self.batch * self.cache_len * self.nheads_k * self.head_dim * element


@dataclass
class DecodeMeasurement:
    provider: str
    case: DecodeCase
    us: float | None = None  # from a CUDA graph
    spread: float | None = None  # the runs' spread around the median (timing.Timing.spread)
    eager_us: float | None = None  # called eagerly, back to back (eager_timing)
    settled: bool | None = None
    gbytes_per_s: float | None = None
    fraction_of_copy: float | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class DecodeInputs:
    """Cache copies (to defeat the L2 cache) and the step's other tensors."""

    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None


def make_inputs(case: DecodeCase, device: torch.device, copies: int, scatter_pages: bool = True) -> DecodeInputs:
    """``copies`` copies of the cache; a paged one's pages scattered over the pool in a random order, or with
    ``scatter_pages`` off one sequence's pages after the other (the layout of a contiguous cache)."""
    dtype = getattr(torch, case.dtype)
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=generator)

    q = randn(case.batch, 1, case.nheads, case.head_dim)
    k_new, v_new = randn(case.batch, 1, case.nheads_k, case.head_dim), randn(case.batch, 1, case.nheads_k,
                                                                              case.head_dim)
    block_table = None
    if case.page_size is None:
        shape = (case.batch, case.cache_len, case.nheads_k, case.head_dim)
    else:
        pages = -(-case.cache_len // case.page_size)
        shape = (case.batch * pages, case.page_size, case.nheads_k, case.head_dim)
        order = torch.randperm(case.batch * pages, device=device, generator=generator) if scatter_pages else \
            torch.arange(case.batch * pages, device=device)
        block_table = order.view(case.batch, pages).to(torch.int32)
    k_caches = [randn(*shape) for _ in range(copies)]
    v_caches = [randn(*shape) for _ in range(copies)]
    # the step appends at position cache_len - 1: write the same key there now, so that every call (and
    # SDPA, which does not append) sees the same cache
    last = case.cache_len - 1
    if block_table is None:
        rows = (slice(None), last)
    else:
        rows = (block_table[:, last // case.page_size].long(), last % case.page_size)
    for k_cache, v_cache in zip(k_caches, v_caches, strict=True):
        k_cache[rows], v_cache[rows] = k_new[:, 0], v_new[:, 0]
    cache_seqlens = torch.full((case.batch,), case.cache_len - 1, dtype=torch.int32, device=device)
    return DecodeInputs(q, k_new, v_new, k_caches, v_caches, cache_seqlens, block_table)


def flashattn_step(num_splits: int, append: bool = True) -> Callable[[DecodeInputs], Runner]:
    """The default decode step of flash_attn_with_kvcache (indices recorded on the device, never waiting for it, so
    that a CUDA graph holds it) on cache copy i, with this split count (0: automatic). ``append=False``: the attention
    alone over the cache that already holds the new key (what SDPA runs)."""

    def build(inputs: DecodeInputs) -> Runner:
        k_new, v_new = (inputs.k_new, inputs.v_new) if append else (None, None)
        cache_seqlens = inputs.cache_seqlens if append else inputs.cache_seqlens + 1

        def step(i: int):
            return flash_attn_with_kvcache(inputs.q, inputs.k_caches[i], inputs.v_caches[i], k_new, v_new,
                                           cache_seqlens=cache_seqlens, block_table=inputs.block_table,
                                           num_splits=num_splits)

        return step

    return build


SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def _sdpa(backend_name: str):
    def build(inputs: DecodeInputs) -> Runner:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if inputs.block_table is not None:
            raise NotImplementedError("SDPA has no paged KV cache")
        backend = getattr(SDPBackend, backend_name)
        q = inputs.q.transpose(1, 2)  # torch's layout (B, H, S, D), views of the same storage
        keys = [k.transpose(1, 2) for k in inputs.k_caches]
        values = [v.transpose(1, 2) for v in inputs.v_caches]

        def step(i: int):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, keys[i], values[i], enable_gqa=True)

        return step

    return build


DECODE_PROVIDERS: dict[str, Callable[[DecodeInputs], Runner]] = {
    "flashattn": flashattn_step(0),
    "flashattn_nosplit": flashattn_step(1),
    "flashattn_noappend": flashattn_step(0, append=False),
    **{f"sdpa_{name.split('_')[0].lower()}": _sdpa(name) for name in SDPA_BACKENDS},
}


def graph_timing(step: Runner, copies: int, device: torch.device) -> Timing:
    """Seconds per step, from a CUDA graph that runs the step over each cache copy in turn."""
    calls = max(copies, 8)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm up (compile, allocate) off the capture
        for i in range(copies):
            step(i)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            step(i % copies)
    timing = time_call(graph.replay, device)
    return Timing(timing.seconds / calls, timing.spread, timing.runs, timing.settled)


def eager_timing(step: Runner, copies: int, device: torch.device) -> Timing:
    """Seconds per step called eagerly, back to back over the cache copies (``timing.time_loop``): the host's time per
    call where it exceeds the GPU's."""
    turn = itertools.count()
    return time_loop(lambda: step(next(turn) % copies), device)


def graph_seconds(step: Runner, copies: int, device: torch.device) -> float:
    """The seconds of :func:`graph_timing`."""
    return graph_timing(step, copies, device).seconds


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float | None:
    """Measured device-to-device copy bandwidth in bytes/s, counting the read and the write."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device)
    return 2 * nbytes / seconds


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)


def choose_grid_copies(kv_bytes: int, l2: int) -> int:
    """Copies of the cache that the timed graph cycles over: together at least 4x the L2 cache."""
    return max(1, -(-4 * l2 // kv_bytes))


def measure_decode(provider: str, case: DecodeCase, device: torch.device, copy_bytes_per_s: float | None,
                   reference: torch.Tensor | None) -> tuple[DecodeMeasurement, torch.Tensor | None]:
    result = DecodeMeasurement(provider, case)
    copies = choose_grid_copies(case.kv_bytes(), l2_bytes(device))
    inputs = None
    try:
        inputs = make_inputs(case, device, copies)
        step = DECODE_PROVIDERS[provider](inputs)
        out = step(0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            timing = graph_timing(step, copies, device)
            result.eager_us = eager_timing(step, copies, device).seconds * 1e6
        else:
            timing = time_call(lambda: step(0), device)
        seconds = timing.seconds
        result.spread, result.settled = timing.spread, timing.settled
        out = out.reshape(case.batch, case.nheads, case.head_dim) if out.dim() == 4 else out
        if reference is not None:
            result.extra["max_diff_vs_flashattn"] = (out.float() - reference.float()).abs().max().item()
        result.us = seconds * 1e6
        result.gbytes_per_s = case.kv_bytes() / seconds / 1e9
        if copy_bytes_per_s:
            result.fraction_of_copy = case.kv_bytes() / seconds / copy_bytes_per_s
        result.extra["cache_copies"] = copies
        return result, out.detach()
    except Exception as exc:  # a provider that cannot run a case is reported, not fatal
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        return result, None
    finally:
        del inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()


def decode_grid(batches, cache_lens, page_sizes, dtype: str) -> list[DecodeCase]:
    return [DecodeCase(b, n, p, dtype=dtype) for p in page_sizes for n in cache_lens for b in batches]


def best_sdpa(measurements: list[DecodeMeasurement], case: DecodeCase, eager: bool = False
              ) -> DecodeMeasurement | None:
    """The fastest SDPA backend on the contiguous version of ``case`` (called eagerly: ``eager``)."""
    contiguous = DecodeCase(case.batch, case.cache_len, None, case.nheads, case.nheads_k, case.head_dim, case.dtype)
    field_name = "eager_us" if eager else "us"
    runs = [m for m in measurements
            if m.provider.startswith("sdpa") and m.case == contiguous and getattr(m, field_name)]
    return min(runs, key=lambda m: getattr(m, field_name), default=None)


def markdown_table(measurements: list[DecodeMeasurement], copy_bytes_per_s: float | None) -> str:
    copy = f"{copy_bytes_per_s / 1e9:.0f} GB/s" if copy_bytes_per_s else "n/a"
    lines = [f"\nDecode step, achieved K/V read bandwidth in GB/s (% of measured copy bandwidth {copy}); "
             "SDPA on the contiguous cache, its fastest backend\n",
             "flashattn's step appends the new key and value (fused); SDPA's does not: 'no append' is "
             "flashattn's attention alone over the same cache, and the last column compares it with SDPA\n",
             "'eager' is the step called eagerly, back to back (the host's time per call where it exceeds the "
             "GPU's), against SDPA's fastest backend so called\n",
             "| cache | batch | layout | flashattn | flashattn, no split | flashattn, no append | best SDPA "
             "| flashattn / SDPA | no append / SDPA | eager us: no append / SDPA | eager no append / SDPA |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    cases = list(dict.fromkeys(m.case for m in measurements if not m.provider.startswith("sdpa")))
    for case in cases:
        cell = {m.provider: m for m in measurements if m.case == case}

        def fmt(m: DecodeMeasurement | None) -> str:
            if m is None or m.error or m.gbytes_per_s is None:
                return "–"
            share = f" ({100 * m.fraction_of_copy:.0f}%)" if m.fraction_of_copy else ""
            return f"{m.gbytes_per_s:.0f}{share}, {m.us:.0f} us"

        sdpa = best_sdpa(measurements, case)

        def ratio(ours: DecodeMeasurement | None, sdpa: DecodeMeasurement | None = sdpa) -> str:
            return f"{sdpa.us / ours.us:.2f}" if sdpa and ours and ours.us else "–"

        sdpa_text = f"{fmt(sdpa)} [{sdpa.provider[5:]}]" if sdpa else "–"
        sdpa_eager = best_sdpa(measurements, case, eager=True)
        layout = "contiguous" if case.page_size is None else f"paged {case.page_size}"
        cache = f"{case.cache_len // 1024}k" if case.cache_len % 1024 == 0 else str(case.cache_len)
        no_append = cell.get("flashattn_noappend")
        eager = (f"{no_append.eager_us:.0f} / {sdpa_eager.eager_us:.0f}"
                 if no_append and no_append.eager_us and sdpa_eager else "–")
        eager_ratio = f"{sdpa_eager.eager_us / no_append.eager_us:.2f}" if eager != "–" else "–"
        lines.append(f"| {cache} | {case.batch} | {layout} | {fmt(cell.get('flashattn'))} | "
                     f"{fmt(cell.get('flashattn_nosplit'))} | {fmt(no_append)} | {sdpa_text} | "
                     f"{ratio(cell.get('flashattn'))} | {ratio(no_append)} | {eager} | {eager_ratio} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, env: dict) -> int:
    """The decode mode of ``flashattn bench``: ``env`` is bench.environment() (GPU, versions, commit)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    batches = args.batches or ((1, 4, 16, 64) if on_gpu else (1, 2))
    cache_lens = args.cache_lens or ((4096, 16384, 65536, 131072) if on_gpu else (256, 1024))
    page_sizes = [None, *(args.page_sizes or ((256,) if on_gpu else (16,)))]
    dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    grid = decode_grid(batches, cache_lens, page_sizes, dtype)
    if not on_gpu:  # a small CPU grid: the cost of the torch path's per-sequence loop, and a check
        grid = [DecodeCase(c.batch, c.cache_len, c.page_size, 8, 2, 64, c.dtype) for c in grid]
    env["copy_bytes_per_s"] = copy_bandwidth(device)
    print(f"# decode  {env.get('device')}  torch {env['torch']}  triton {env['triton']}  commit {env['commit']}"
          f"  copy {env['copy_bytes_per_s'] and round(env['copy_bytes_per_s'] / 1e9)} GB/s", flush=True)
    sdpa_providers = [p for p in DECODE_PROVIDERS if p.startswith("sdpa")] if on_gpu else ["sdpa_math"]
    measurements: list[DecodeMeasurement] = []
    for case in grid:
        providers = ["flashattn", "flashattn_nosplit", "flashattn_noappend"] + (
            sdpa_providers if case.page_size is None else [])
        reference = None
        for provider in providers:
            if provider == "sdpa_math" and case.kv_bytes() * case.nheads // case.nheads_k > (4 << 30):
                continue  # the math backend repeats K/V per query head: skipped past 4 GiB
            m, out = measure_decode(provider, case, device, env["copy_bytes_per_s"], reference)
            if provider == "flashattn":
                reference = out
            measurements.append(m)
            if m.error:
                shown = m.error
            else:
                shown = f"{Timing(m.us / 1e6, m.spread, 0, m.settled).describe():>22}  {m.gbytes_per_s:7.1f} GB/s"
            layout = "contig" if case.page_size is None else f"page{case.page_size}"
            print(f"b={case.batch:<3} cache={case.cache_len:<7} {layout:<8} {provider:<18} {shown}", flush=True)
    table = markdown_table(measurements, env["copy_bytes_per_s"])
    path = write_results(args.out, env, measurements)
    print(table)
    print(f"results: {path.resolve()}")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


def write_results(folder: Path, env: dict, measurements: list[DecodeMeasurement]) -> Path:
    """``folder``/<machine>-decode.json (``results.write_results``): the environment and one row per provider and case,
    replacing the previous decode run of this kind of machine."""
    return results.write_results(folder, env, "decode", [asdict(m) for m in measurements])
