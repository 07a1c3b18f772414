"""Host time of the serving entry points (GPU): packed (varlen) calls and KV-cache decode steps, issued eagerly, with
and without launch plans (``ops.LAUNCH_PLANS``), beside SDPA's cuDNN and flash backends on the same decode step.

For each call: the host microseconds to issue it (``bench.host_microseconds``: calls back to back, the GPU left to
catch up), and the wall microseconds per call of the same loop with the GPU's work included (synchronized at its end).
Where the two are close, the GPU waits on the host: the call is host-bound, which a CUDA graph would hide.

    PYTHONPATH=src python3 benchmarks/host_serving.py [--calls 300] [--breakdown]

``--breakdown`` then times the functions on the path of a planned decode step (batch 8, contiguous) and of a packed
forward (the bench's 512-token hdim-256 causal cell), with ``host_breakdown``'s timers.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from host_breakdown import _TOTALS, _report, _wrap_all  # benchmarks/, beside this script
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn import flash_attn_varlen_func, flash_attn_with_kvcache, launcher, ops
from flashattn.bench import host_microseconds

# the functions on a planned decode step's path, outermost first
DECODE_PATH = (
    ("flashattn.kvcache", "_plannable_step"),
    ("flashattn.ops", "planned"),
    ("flashattn.kvcache", "_kvcache_step"),
    ("flashattn.kvcache", "_validate_cache"),
    ("flashattn.kvcache", "_validate_rotary"),
    ("flashattn.kvcache", "_validate_options"),
    ("flashattn.kvcache", "_cache_seqlens_tensor"),
    ("flashattn.options", "AttentionOptions.build"),
    ("flashattn.ops", "eager_call"),
    ("flashattn.decode_ops", "kvcache_append_attention_cuda"),
    ("flashattn.decode_ops", "_planned_attention"),
    ("flashattn.decode_ops", "_plannable"),
    ("flashattn.decode_ops", "planned"),
    ("flashattn.launcher", "planned"),
    ("flashattn.launcher", "_same_tensors"),
    ("flashattn.launcher", "LaunchPlan.replay"),
    ("flashattn.launcher", "_run"),
    ("torch", "empty_strided"),
)


def wall_microseconds(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / calls * 1e6


def varlen_calls(lengths: list[int], causal: bool) -> dict:
    """A packed batch of ``lengths`` (GQA 32/8, hdim 128, bf16): its forward without grad, and forward + backward."""
    total, longest = sum(lengths), max(lengths)
    cu_seqlens = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(total, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(total, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dout = torch.randn_like(q)

    def forward():
        with torch.no_grad():
            return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=causal)

    def forward_backward():
        out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=causal)
        return torch.autograd.grad(out, (q, k, v), dout)

    name = f"varlen {len(lengths)} seqs, {total} tokens"
    return {f"{name}, forward": forward, f"{name}, forward + backward": forward_backward}


def decode_calls(batch: int, cache_len: int, page_size: int | None) -> dict:
    """One decode step (one query token, GQA 32/8, hdim 128, bf16) with a one-token append, over caches filled to
    ``cache_len - 1``; the same step through SDPA (no append) on the contiguous layout."""
    shape = (batch, cache_len, 8, 128)
    k_cache, v_cache = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(batch, 1, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((batch,), cache_len - 1, device="cuda", dtype=torch.int32)
    extra = {}
    if page_size is not None:
        pages = batch * cache_len // page_size
        k_cache, v_cache = (c.view(pages, page_size, 8, 128) for c in (k_cache, v_cache))
        extra["block_table"] = torch.arange(pages, device="cuda", dtype=torch.int32).view(batch, -1)
    layout = "contiguous" if page_size is None else f"paged {page_size}"
    name = f"decode batch {batch}, cache {cache_len}, {layout}"
    calls = {
        f"{name}, flashattn": lambda: flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                              cache_seqlens=seqlens, check_indices=False, **extra),
        f"{name}, flashattn checked": lambda: flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                                      cache_seqlens=seqlens, **extra),
    }
    if page_size is None:
        q_t, k_t, v_t = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q_t, k_t, v_t, enable_gqa=True)
            calls[f"{name}, sdpa {backend.name.split('_')[0].lower()}"] = sdpa
    return calls


# the functions on a planned varlen forward's path (with autograd), outermost first
VARLEN_PATH = (
    ("flashattn.varlen", "_validate_varlen"),
    ("flashattn.varlen", "_max_seqlen_argument"),
    ("flashattn.options", "AttentionOptions.build"),
    ("flashattn.autograd", "FlashAttnVarlenFunction.forward"),
    ("flashattn.ops", "eager_call"),
    ("flashattn.ops", "varlen_attention_forward_cuda"),
    ("flashattn.ops", "_varlen_plannable"),
    ("flashattn.ops", "planned"),
    ("flashattn.launcher", "planned"),
    ("flashattn.launcher", "_same_tensors"),
    ("flashattn.launcher", "LaunchPlan.replay"),
    ("flashattn.launcher", "_run"),
    ("triton.backends.nvidia.driver", "CudaLauncher.__call__"),
    ("torch", "empty_strided"),
)


_WRAPPED: set = set()


def breakdown(title: str, step, wrapped: tuple, calls: int) -> None:
    """``step``'s host time per call, function by function (``host_breakdown``'s timers), plans on."""
    ops.LAUNCH_PLANS = True
    step()
    _wrap_all(tuple(entry for entry in wrapped if entry not in _WRAPPED))  # each function wrapped once
    _WRAPPED.update(wrapped)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    _TOTALS.clear()
    started = time.perf_counter()
    for _ in range(calls):
        step()
    elapsed = (time.perf_counter() - started) / calls * 1e6
    torch.cuda.synchronize()
    _report(f"{title}, plans on, wrapped ({elapsed:.1f} us per call)", calls)


def bench_varlen_forward(head_dim: int, causal: bool):
    """The bench's packed provider at 512 tokens (16k tokens, heads x head dim = 2048, equal lengths), forward with
    grad on, and the dense call on the same tokens."""
    nheads, batch = 2048 // head_dim, 32
    q, k, v = (torch.randn(batch, 512, nheads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    cu_seqlens = torch.arange(0, batch * 512 + 1, 512, device="cuda", dtype=torch.int32)
    packed = [x.flatten(0, 1) for x in (q, k, v)]
    from flashattn import flash_attn_func
    return {
        f"bench 512 tokens hdim {head_dim} causal {causal}, dense forward":
            lambda: flash_attn_func(q, k, v, causal=causal),
        f"bench 512 tokens hdim {head_dim} causal {causal}, varlen forward":
            lambda: flash_attn_varlen_func(*packed, cu_seqlens, cu_seqlens, 512, 512, causal=causal),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    calls = {}
    calls.update(varlen_calls([300, 17, 1, 512, 1200, 64, 900, 1102], causal=True))
    calls.update(decode_calls(1, 4096, None))
    calls.update(decode_calls(8, 4096, None))
    calls.update(decode_calls(8, 4096, 256))
    calls.update(bench_varlen_forward(256, True))
    calls.update(bench_varlen_forward(128, True))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us per call, {args.calls} calls back to back")
    print("| call | plans | host us | wall us |")
    print("|---|---|---|---|")
    for name, fn in calls.items():
        for plans in ((False, True) if "sdpa" not in name else (None,)):
            if plans is not None:
                ops.LAUNCH_PLANS = plans
                launcher.clear_plans()
            try:
                host = host_microseconds(fn, device, args.calls)
                wall = wall_microseconds(fn, args.calls)
            except RuntimeError as error:  # an SDPA backend that refuses the shape
                print(f"| {name} | – | failed: {str(error).splitlines()[0][:80]} | |")
                continue
            label = "–" if plans is None else ("on" if plans else "off")
            print(f"| {name} | {label} | {host:.1f} | {wall:.1f} |", flush=True)
    if args.breakdown:
        name = "decode batch 8, cache 4096, contiguous, flashattn"
        breakdown(name, calls[name], DECODE_PATH, args.calls)
        name = "bench 512 tokens hdim 256 causal True, varlen forward"
        breakdown(name, calls[name], VARLEN_PATH, args.calls)


if __name__ == "__main__":
    main()
