"""Where a short call's host time goes, function by function (GPU): each listed function is wrapped in a timer that
adds up its inclusive wall time, and the forward and backward of one small problem run back to back. Unlike
cProfile, which charges every Python call, this costs about half a microsecond per wrapped call, so the figures
are close to an unprofiled run's.

    PYTHONPATH=src python3 benchmarks/host_breakdown.py [--seqlen 512] [--head-dim 128] [--causal] [--calls 500]

Prints, per forward and per backward: the whole call's host microseconds unwrapped, then each wrapped function's
calls and inclusive microseconds per forward or backward, and the time of a few building blocks in isolation
(an empty autograd.Function's backward, torch.empty_like, a TensorDescriptor, a stream fork and join).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import time
from collections import defaultdict

import torch
from host_profile import IdentityFunction  # benchmarks/, beside this script

from flashattn import flash_attn_func, ops
from flashattn.bench import host_microseconds

# (module, attribute): the call path of the forward and backward, outermost first
WRAPPED = (
    ("flashattn.interface", "_validate"),
    ("flashattn.options", "AttentionOptions.build"),
    ("flashattn.autograd", "FlashAttnFunction.forward"),
    ("flashattn.autograd", "FlashAttnFunction.backward"),
    ("flashattn.ops", "eager_call"),
    ("flashattn.ops", "attention_forward_cuda"),
    ("flashattn.ops", "attention_backward_cuda"),
    ("flashattn.ops", "_triton_forward"),
    ("flashattn.ops", "_triton_backward"),
    ("flashattn.ops", "_warp_specialized_fits"),
    ("flashattn.ops", "_warp_specialized_dq_fits"),
    ("flashattn.ops", "_Layout.of"),
    ("flashattn.configs", "tile_config"),
    ("flashattn.ops", "dkdv_compilable"),
    ("flashattn.ops", "_block_map_arguments"),
    ("flashattn.ops", "_mask_arguments"),
    ("flashattn.ops", "_kernel_scalars"),
    ("flashattn.ops", "_alibi_args"),
    ("flashattn.ops", "_tma_loads"),
    ("flashattn.ops", "_gradient_streams_pay"),
    ("flashattn.ops", "_warp_specialized_forward"),
    ("flashattn.ops", "_warp_specialized_dkdv"),
    ("flashattn.ops", "_warp_specialized_dq"),
    ("flashattn.ops", "_tile_plan_arguments"),
    ("flashattn.ops", "_token_descriptor"),
    ("flashattn.ops", "launch"),
    ("triton.backends.nvidia.driver", "CudaLauncher.__call__"),
    ("triton.backends.nvidia.driver", "make_tensordesc_arg"),
    ("torch", "empty_like"),
    ("torch", "empty"),
    ("torch", "empty_strided"),
    ("flashattn.ops", "_plannable"),
    ("flashattn.ops", "planned"),
    ("flashattn.launcher", "planned"),
    ("flashattn.launcher", "LaunchPlan.replay"),
    ("flashattn.launcher", "_run"),
)

_TOTALS: dict[str, list] = defaultdict(lambda: [0, 0])  # name -> [calls, nanoseconds]


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        started = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            total = _TOTALS[name]
            total[0] += 1
            total[1] += time.perf_counter_ns() - started

    return wrapper


def _wrap_all(wrapped: tuple = WRAPPED) -> None:
    for module_name, attribute in wrapped:
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if isinstance(raw, (staticmethod, classmethod)):
            setattr(owner, name, type(raw)(_timed(attribute, raw.__func__)))
        else:
            setattr(owner, name, _timed(attribute, raw))


def _report(title: str, calls: int) -> None:
    print(f"--- {title}: inclusive microseconds per call (wrapped calls per call)")
    for name, (count, nanoseconds) in _TOTALS.items():
        if count:
            print(f"{name:45s} {nanoseconds / calls / 1e3:8.1f} us  ({count / calls:.1f} calls)")
    _TOTALS.clear()


def building_blocks(q: torch.Tensor, calls: int) -> None:
    """The host time of pieces every call pays, each on its own."""
    x = torch.randn(8, device="cuda", requires_grad=True)
    y = IdentityFunction.apply(x)
    grad_y = torch.ones_like(y)
    side = torch.cuda.Stream()

    def fork_join():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            pass
        main.wait_stream(side)

    blocks = {
        "autograd.grad of an empty Function": lambda: torch.autograd.grad(y, x, grad_y, retain_graph=True),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "ops._token_descriptor(q, 64)": lambda: ops._token_descriptor(q, 64),
        "a stream fork and join": fork_join,
        "q.stride() and q.shape": lambda: (q.stride(), q.shape),
        "q.data_ptr()": q.data_ptr,
    }
    for name, fn in blocks.items():
        print(f"block: {name:40s} {host_microseconds(fn, torch.device('cuda'), calls):7.2f} us", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    batch, heads = max(1, 16384 // args.seqlen), 2048 // args.head_dim
    q, k, v = (torch.randn(batch, args.seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=args.causal)
    dout = torch.randn_like(out)

    def forward():
        return flash_attn_func(q, k, v, causal=args.causal)

    def forward_no_grad():
        with torch.no_grad():
            return flash_attn_func(q, k, v, causal=args.causal)

    def backward():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    print(f"hdim {args.head_dim}, seqlen {args.seqlen}, causal {args.causal}, batch {batch}, heads {heads}")
    device = torch.device("cuda")
    calls = {"forward (grad on)": forward, "forward (no grad)": forward_no_grad, "backward": backward}
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        q_t, k_t, v_t = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        sdpa_out = torch.nn.functional.scaled_dot_product_attention(q_t, k_t, v_t, is_causal=args.causal)
        sdpa_dout = dout.transpose(1, 2)
        sdpa_calls = {
            "sdpa_flash forward": lambda: torch.nn.functional.scaled_dot_product_attention(q_t, k_t, v_t,
                                                                                            is_causal=args.causal),
            "sdpa_flash backward": lambda: torch.autograd.grad(sdpa_out, (q_t, k_t, v_t), sdpa_dout,
                                                               retain_graph=True),
        }
        for name, fn in sdpa_calls.items():
            print(f"unwrapped: {name:20s} {host_microseconds(fn, device, args.calls):7.1f} us of host time per call",
                  flush=True)
    for plans in (False, True):
        ops.LAUNCH_PLANS = plans
        for name, fn in calls.items():
            print(f"unwrapped, launch plans {plans}: {name:20s} {host_microseconds(fn, device, args.calls):7.1f} us "
                  "of host time per call", flush=True)
    building_blocks(q, args.calls)
    _wrap_all()
    for (name, fn), plans in itertools.product(calls.items(), (False, True)):
        ops.LAUNCH_PLANS = plans
        name = f"{name}, launch plans {plans}"
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        _TOTALS.clear()
        started = time.perf_counter()
        for _ in range(args.calls):
            fn()
        elapsed = (time.perf_counter() - started) / args.calls * 1e6
        torch.cuda.synchronize()
        _report(f"{name}, wrapped ({elapsed:.1f} us per call)", args.calls)
    for plans in (False, True):
        ops.LAUNCH_PLANS = plans
        for name, fn in calls.items():
            print(f"unwrapped again, launch plans {plans}: {name:20s} "
                  f"{host_microseconds(fn, device, args.calls):7.1f} us", flush=True)


if __name__ == "__main__":
    main()
