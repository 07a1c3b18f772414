"""FP8 attention's error against a float64 reference, FlashAttention-3's table on the CPU: bf16, FP8 per tensor,
FP8 per block, and FP8 per block with the Hadamard rotation; with ``--gradients``, the gradients' error instead.

Inputs follow FlashAttention-3's numerical-error experiment (Shah et al., 2024, arXiv:2407.08608, section 4.3):
every entry of q, k, v is N(0, 1) + N(0, 100) * Bernoulli(0.001), outliers of standard deviation 10 at a rate of
0.1%. The FP8 rows emulate the kernel (``testing.fp8_emulated_attention``): e4m3 q, k, v, P scaled by fp8.P_SCALE
and rounded to e4m3 in 128-key blocks of the online softmax, the output rounded to bfloat16. The bf16 row is
flashattn's own forward on bfloat16 inputs. RMSE over every output element.

The gradients (``--gradients``): dQ, dK, dV of a dO drawn like q, k, v, against float64 autograd of the unquantized
inputs. bf16 is flashattn's backward on bfloat16 inputs; the FP8 rows are ``fp8.flash_attn_func`` on the same
bfloat16 inputs, block descales, with and without the rotation: the PyTorch path, whose backward rounds dO, P and dS
to e4m3 as the Hopper kernel is to (its forward on the CPU computes on the dequantized values without rounding P,
which reaches the gradients through delta = rowsum(dO * O) only).

    python benchmarks/fp8_accuracy.py              # writes benchmarks/results/cpu-accuracy.json and the table
    python benchmarks/fp8_accuracy.py --gradients  # writes benchmarks/results/cpu-gradients.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from flashattn import flash_attn_func, fp8
from flashattn.reference import attention_ref
from flashattn.testing import fp8_emulated_attention
from flashattn.tools.bench import environment
from flashattn.tools.results import write_results

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("bf16", "fp8 per tensor", "fp8 per block", "fp8 per block + Hadamard")
GRADIENT_VARIANTS = ("bf16", "fp8 per block", "fp8 per block + Hadamard")


def outlier_inputs(batch: int, seqlen: int, nheads: int, head_dim: int, seed: int, count: int = 3,
                   ) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, seqlen, nheads, head_dim)
    tensors = []
    for _ in range(count):
        x = torch.randn(shape, generator=generator, dtype=torch.float64)
        spikes = torch.rand(shape, generator=generator, dtype=torch.float64) < 1e-3
        tensors.append(x + 10.0 * torch.randn(shape, generator=generator, dtype=torch.float64) * spikes)
    return tensors


def per_tensor(x: torch.Tensor, nheads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor (amax / 448), as a (batch, nheads_k) descale."""
    scale = x.abs().max().float() / fp8.E4M3_MAX
    descale = scale.expand(x.shape[0], nheads_k).contiguous()
    return (x.float() / scale).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(fp8.FP8_DTYPE), descale


def fp8_output(quantized: fp8.Quantized, causal: bool) -> torch.Tensor:
    inputs = [fp8.dequantize(x, d, torch.float64) for x, d in zip(quantized[:3], quantized[3:], strict=True)]
    return fp8_emulated_attention(*inputs, causal=causal, block_n=fp8.SCALE_BLOCK).to(torch.bfloat16).double()


def measure(batch: int, seqlen: int, nheads: int, head_dim: int, causal: bool, seed: int) -> dict:
    q, k, v = outlier_inputs(batch, seqlen, nheads, head_dim, seed)
    oracle, _ = attention_ref(q, k, v, causal=causal)
    outputs = {"bf16": flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal).double()}
    tensor_q, tensor_k, tensor_v = (per_tensor(x, nheads) for x in (q, k, v))
    outputs["fp8 per tensor"] = fp8_output(fp8.Quantized(tensor_q[0], tensor_k[0], tensor_v[0], tensor_q[1],
                                                         tensor_k[1], tensor_v[1]), causal)
    outputs["fp8 per block"] = fp8_output(fp8.quantize(q, k, v, hadamard=False), causal)
    outputs["fp8 per block + Hadamard"] = fp8_output(fp8.quantize(q, k, v, hadamard=True, seed=seed), causal)
    rmse = {name: (out - oracle).pow(2).mean().sqrt().item() for name, out in outputs.items()}
    return dict(batch=batch, seqlen=seqlen, nheads=nheads, head_dim=head_dim, causal=causal, seed=seed, rmse=rmse)


def measure_gradients(batch: int, seqlen: int, nheads: int, head_dim: int, causal: bool, seed: int) -> dict:
    q, k, v, dout = outlier_inputs(batch, seqlen, nheads, head_dim, seed, count=4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = attention_ref(*leaves, causal=causal)
    oracle = torch.autograd.grad(out, leaves, dout)
    attend = {"bf16": flash_attn_func,
              "fp8 per block": functools.partial(fp8.flash_attn_func, hadamard=False),
              "fp8 per block + Hadamard": functools.partial(fp8.flash_attn_func, hadamard=True, seed=seed)}
    rmse = {}
    for name, function in attend.items():
        leaves = [x.bfloat16().requires_grad_() for x in (q, k, v)]
        grads = torch.autograd.grad(function(*leaves, causal=causal), leaves, dout.bfloat16())
        rmse[name] = {label: (grad.double() - want).pow(2).mean().sqrt().item()
                      for label, grad, want in zip(("dq", "dk", "dv"), grads, oracle, strict=True)}
    return dict(batch=batch, seqlen=seqlen, nheads=nheads, head_dim=head_dim, causal=causal, seed=seed, rmse=rmse)


def gradients_markdown(rows: list[dict]) -> str:
    lines = ["| head dim | tokens | causal | gradient | " + " | ".join(GRADIENT_VARIANTS)
             + " | per block / per block + Hadamard |", "|---|---|---|---|" + "---|" * (len(GRADIENT_VARIANTS) + 1)]
    for row in rows:
        rmse = row["rmse"]
        for label in ("dq", "dk", "dv"):
            ratio = rmse["fp8 per block"][label] / rmse["fp8 per block + Hadamard"][label]
            lines.append(f"| {row['head_dim']} | {row['seqlen']} | {int(row['causal'])} | {label} | "
                         + " | ".join(f"{rmse[name][label]:.2e}" for name in GRADIENT_VARIANTS) + f" | {ratio:.2f}x |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    lines = ["| head dim | tokens | causal | " + " | ".join(VARIANTS) + " | per tensor / per block + Hadamard |",
             "|---|---|---|" + "---|" * (len(VARIANTS) + 1)]
    for row in rows:
        rmse = row["rmse"]
        ratio = rmse["fp8 per tensor"] / rmse["fp8 per block + Hadamard"]
        lines.append(f"| {row['head_dim']} | {row['seqlen']} | {int(row['causal'])} | "
                     + " | ".join(f"{rmse[name]:.2e}" for name in VARIANTS) + f" | {ratio:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[128, 256])
    parser.add_argument("--nheads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--causal", nargs="+", type=int, default=[0], choices=(0, 1))
    parser.add_argument("--gradients", action="store_true", help="the gradients' error (dQ, dK, dV) instead")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of cpu-accuracy.json / cpu-gradients.json")
    args = parser.parse_args(argv)
    run, render = (measure_gradients, gradients_markdown) if args.gradients else (measure, markdown)
    rows = []
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            for causal in args.causal:
                rows.append(run(1, seqlen, args.nheads, head_dim, bool(causal), args.seed))
                print("\n".join(render(rows[-1:]).splitlines()[2:]), flush=True)
    table = render(rows)
    mode = "gradients" if args.gradients else "accuracy"
    path = write_results(args.out, environment(), mode, rows, machine="cpu")
    print(table)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
