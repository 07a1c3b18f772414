"""Training parity of FP8 attention: a byte-level causal language model trained in bf16, then with FP8 attention.

    PYTHONPATH=src python benchmarks/train_lm.py --attention bf16    # writes benchmarks/results/h200-train_bf16.json
    PYTHONPATH=src python benchmarks/train_lm.py --attention fp8     # writes benchmarks/results/h200-train_fp8.json
    PYTHONPATH=src python benchmarks/train_lm.py --plot benchmarks/results/h200-train_bf16.json \\
        benchmarks/results/h200-train_fp8.json                       # docs/figures/train-lm-h200.png, the two losses

The data: the Python standard library's own ``.py`` files (``sysconfig.get_paths()["stdlib"]``, without
site-packages / dist-packages), on every machine and never downloaded. The files are sorted by their path relative
to that folder; a file is in the validation set when the CRC-32 of that path is 0 mod 10 (about 10% of the files,
the same split whatever files the installation adds or lacks), in the training set otherwise. Each set is its
files' bytes concatenated in that order, one 256-token vocabulary. A training batch is ``--batch`` windows of
``--context`` + 1 bytes at random offsets of the training bytes (a generator seeded by ``--seed``, so both runs see
the same batches); the validation loss is the mean over ``--eval-batches`` batches of windows at evenly spaced
offsets of the validation bytes, the same windows at every evaluation. The corpus differs between Python versions:
compare runs of the same machine.

The model: token embedding, ``--layers`` pre-LayerNorm blocks of ``flashattn.nn.SelfAttention`` (causal, rotary,
head dim ``--d-model / --heads``) and a GELU MLP of 4 x ``--d-model``, a final LayerNorm and a linear head; weights
N(0, 0.02), biases zero. The weights, the optimizer's state and the loss are float32 (the master weights); the
forward runs under bf16 autocast, so the projections, and with them q, k, v, are bfloat16. ``--attention bf16``
calls ``flashattn.flash_attn_func`` on them, ``--attention fp8`` ``flashattn.fp8.flash_attn_func``, which quantizes
them to e4m3 (block descales, the random Hadamard rotation, drawn per call from the seeded default generator) and
rounds dO, P and dS to e4m3 in its backward. Everything else is the same code in both runs, from the same seed.
AdamW (betas 0.9 / 0.95, weight decay 0.1 on the matrices only), a linear warm-up over ``--warmup`` steps to
``--lr``, then a cosine to a tenth of it at ``--steps``; gradients clipped to norm 1.

The default run on an H200: 6 layers, d-model 1024 (8 heads of 128), 2k context, batch 16: 32,768 tokens a step,
76M parameters. 6 FLOPs a token per matmul weight (75.5M in the blocks, 0.26M in the head): 455M; 6 causal
attentions at 3.5 x 2 x 2048 x 1024 = 14.7M each (forward and backward, flashattn.flops' convention): 88M; 0.54
GFLOP a token, 17.8 TFLOP a step, 0.06 s at 300 TFLOP/s effective: 2000 steps in about 2 minutes, evaluations
(20 x 8 forward batches) adding about 5%. The script prints its count at the start.

The FP8 run costs more than its FLOPs: its forward is the FP8 kernel, but its backward is the PyTorch path
(``fp8_backward``, a few dozen operations per 128-key block of a layer), 0.25 s a step on an H200 against the bf16
run's 0.07: 2000 steps in about 8.5 minutes. A run longer than one command goes on from ``--checkpoint`` (weights,
AdamW's state, the batches' generator and the default generator, which draws the FP8 rotations' seeds; about 0.9 GB
at the default size) when ``--time-limit`` stops it, as long as the machine keeps its disk: the same losses as one
uninterrupted run.

Every ``--eval-every`` steps (and after the last) a row: the step, the mean training loss since the previous row,
the validation loss, and the seconds since training started. ``--out`` gets ``<machine>-train_<attention>.json``
(``flashattn.tools.results.write_results``: the environment, with the run's settings under ``settings``, and the
rows). ``--plot BF16_JSON FP8_JSON`` draws both runs' curves and prints the final validation losses and their
relative difference (issue 45 asks for at most 1%).

On a CPU with tiny settings (the FP8 attention runs its PyTorch reference path there), a few seconds:

    PYTHONPATH=src python benchmarks/train_lm.py --layers 2 --d-model 128 --heads 1 --context 64 --batch 2 \\
        --steps 3 --eval-every 2 --device cpu --out /tmp/train-lm
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import flashattn
from flashattn import flops, fp8
from flashattn.nn import SelfAttention
from flashattn.tools.bench import environment
from flashattn.tools.results import write_results

STARTED = time.perf_counter()  # --time-limit counts from the start, imports and the corpus included
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures"
VOCAB = 256  # bytes
VALIDATION_MODULUS = 10  # a file is validation when crc32(its relative path) % 10 == 0
SKIPPED_FOLDERS = {"site-packages", "dist-packages", "__pycache__"}
ATTENTION = {"bf16": flashattn.flash_attn_func, "fp8": fp8.flash_attn_func}


# -- data --

def stdlib_files(root: Path | None = None) -> list[str]:
    """The standard library's .py files, as sorted POSIX paths relative to ``root`` (default: its folder)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        # third-party code may sit inside the stdlib folder: not walked into at all (it can be most of the folder)
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_FOLDERS]
        base = Path(folder).relative_to(root)
        files += [(base / name).as_posix() for name in names if name.endswith(".py")]
    return sorted(files)


def is_validation(path: str) -> bool:
    """The split by file: a hash of the path, so a file's side does not depend on which other files exist."""
    return zlib.crc32(path.encode()) % VALIDATION_MODULUS == 0


@functools.lru_cache(maxsize=2)
def corpus(root: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(training bytes, validation bytes), uint8, each its files concatenated in sorted order."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    parts = {False: [], True: []}
    for path in stdlib_files(base):
        parts[is_validation(path)].append((base / path).read_bytes())
    return tuple(torch.frombuffer(bytearray(b"".join(parts[side])), dtype=torch.uint8) for side in (False, True))


def windows(data: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (batch, context), int64, from the windows of context + 1 bytes at ``starts``."""
    rows = data[starts[:, None] + torch.arange(context + 1)].long()
    return rows[:, :-1], rows[:, 1:]


def validation_starts(data: torch.Tensor, count: int, context: int) -> torch.Tensor:
    """``count`` evenly spaced window offsets over the validation bytes: the same windows at every evaluation."""
    return torch.linspace(0, len(data) - context - 1, count).long()


# -- model --

class Block(nn.Module):
    """Pre-LayerNorm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, attention) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, attention=attention)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class ByteLM(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, attention) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, attention) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (batch, seqlen) -> (batch, seqlen, VOCAB)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def flops_per_token(layers: int, dim: int, context: int) -> float:
    """Training FLOPs a token: 6 per matmul weight (12 dim^2 a block, and the head), and the causal attention's
    forward (2 x context x dim a token) and backward (``flashattn.flops.backward_of``)."""
    matmuls = 6 * (layers * 12 * dim * dim + dim * VOCAB)
    attention = 2 * context * dim
    return matmuls + layers * (attention + flops.backward_of(attention))


def learning_rate(step: int, peak: float, warmup: int, steps: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine down to peak / 10 at ``steps``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


# -- training --

def evaluate(model: ByteLM, data: torch.Tensor, starts: torch.Tensor, args, device: torch.device) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        for chunk in starts.split(args.batch):
            inputs, targets = (t.to(device) for t in windows(data, chunk, args.context))
            logits = model(inputs).float()
            total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
    model.train()
    return total / (len(starts) * args.context)


def train(args, save_rows) -> tuple[list[dict], bool]:
    """The rows, and whether the run finished: False when ``--time-limit`` cut it short (after saving
    ``--checkpoint``, from which the same command goes on). ``save_rows(rows)`` runs after each evaluation."""
    device = torch.device(args.device)
    train_data, validation_data = corpus()
    torch.manual_seed(args.seed)
    model = ByteLM(args.layers, args.d_model, args.heads, ATTENTION[args.attention]).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    batches = torch.Generator().manual_seed(args.seed)  # the data's own stream: the same batches in both runs
    val_starts = validation_starts(validation_data, args.eval_batches * args.batch, args.context)
    tokens = args.batch * args.context
    step_flops = tokens * flops_per_token(args.layers, args.d_model, args.context)
    print(f"{args.attention}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{tokens} tokens a step, {step_flops / 1e12:.2f} TFLOP a step; training {len(train_data) / 1e6:.1f} MB, "
          f"validation {len(validation_data) / 1e6:.1f} MB", flush=True)
    rows, first, before = [], 0, 0.0
    if args.checkpoint is not None and args.checkpoint.exists():
        state = torch.load(args.checkpoint, map_location=device, weights_only=False)
        if state["settings"] != settings(args):
            raise SystemExit(f"{args.checkpoint} is another run's (settings {state['settings']}): remove it")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batches.set_state(state["batches"])
        torch.set_rng_state(state["rng"])  # the FP8 rotations' seeds are drawn from it
        rows, first, before = state["rows"], state["step"], state["time_s"]
        print(f"resumed from {args.checkpoint} at step {first}", flush=True)
    running, since = torch.zeros((), device=device), 0
    start = time.perf_counter()
    for step in range(first, args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.lr, args.warmup, args.steps)
        starts = torch.randint(0, len(train_data) - args.context - 1, (args.batch,), generator=batches)
        inputs, targets = (t.to(device, non_blocking=True) for t in windows(train_data, starts, args.context))
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # the loss in float32
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running += loss.detach()
        since += 1
        if (step + 1) % args.eval_every and step + 1 != args.steps:
            continue
        train_loss = running.item() / since
        elapsed = before + time.perf_counter() - start  # .item() above waited for the device
        rows.append({"step": step + 1, "train_loss": train_loss,
                     "validation_loss": evaluate(model, validation_data, val_starts, args, device), "time_s": elapsed})
        running.zero_()
        since = 0
        print(f"step {step + 1:5d}  train {train_loss:.4f}  validation {rows[-1]['validation_loss']:.4f}  "
              f"{elapsed:7.1f} s", flush=True)
        save_rows(rows)
        out_of_time = args.time_limit is not None and time.perf_counter() - STARTED > args.time_limit
        if args.checkpoint is not None and step + 1 < args.steps and out_of_time:
            state = {"settings": settings(args), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "batches": batches.get_state(), "rng": torch.get_rng_state(), "rows": rows, "step": step + 1,
                     "time_s": elapsed}
            partial = args.checkpoint.with_name(args.checkpoint.name + ".partial")
            torch.save(state, partial)
            os.replace(partial, args.checkpoint)  # whole or not at all: a run killed while saving keeps the last one
            print(f"--time-limit: stopped at step {step + 1}, saved {args.checkpoint}; run the same command again to "
                  "go on", flush=True)
            return rows, False
    return rows, True


def settings(args) -> dict:
    """What defines a run (a checkpoint resumes only the same one), JSON's types."""
    skipped = {"plot", "figure", "out", "checkpoint", "time_limit", "device"}
    return {k: v for k, v in vars(args).items() if k not in skipped}


# -- the two runs' curves --

def compare(paths: list[Path], figure: Path | None) -> None:
    """Print each run's final validation loss and the relative difference of the second from the first; draw both
    runs' curves into ``figure`` (training dashed, validation solid)."""
    runs = [(json.loads(p.read_text()), p) for p in paths]
    finals = []
    for data, path in runs:
        final = data["results"][-1]
        finals.append(final["validation_loss"])
        print(f"{path.name}: final validation loss {final['validation_loss']:.4f} at step {final['step']}")
    if len(finals) == 2:
        print(f"relative difference: {(finals[1] - finals[0]) / finals[0]:+.2%}")
    if figure is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure_, axes = plt.subplots(figsize=(8, 5), layout="constrained")
    for (data, _), color in zip(runs, ("tab:blue", "tab:orange", "tab:green"), strict=False):
        rows, label = data["results"], data["environment"]["settings"]["attention"]
        steps = [r["step"] for r in rows]
        style = dict(marker=".", color=color)  # markers: a run of one evaluation is still drawn
        axes.plot(steps, [r["train_loss"] for r in rows], "--", alpha=0.6, label=f"{label} training", **style)
        axes.plot(steps, [r["validation_loss"] for r in rows], "-", label=f"{label} validation", **style)
    env = runs[0][0]["environment"]
    settings = env["settings"]
    axes.set(xlabel="step", ylabel="loss (nats per byte)",
             title=f"Byte-level LM on the Python stdlib: {settings['layers']} layers, d-model {settings['d_model']}, "
                   f"{settings['context']} context ({env.get('device')})")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.parent.mkdir(parents=True, exist_ok=True)
    figure_.savefig(figure, dpi=120)
    plt.close(figure_)
    print(f"wrote {figure}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--attention", choices=tuple(ATTENTION), default="bf16")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="with --time-limit: where a run cut short saves its state, and from which it goes on")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds: stop at the first evaluation after this (from the start of the process)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the folder of <machine>-train_<attention>.json")
    parser.add_argument("--plot", type=Path, nargs="+", metavar="JSON",
                        help="no training: compare these runs (bf16 first) and draw their curves")
    parser.add_argument("--figure", type=Path, default=None,
                        help="the --plot figure (default docs/figures/train-lm-<machine>.png)")
    args = parser.parse_args(argv)
    if args.plot:
        machine = Path(args.plot[0]).stem.rpartition("-")[0]
        compare(args.plot, args.figure or FIGURES / f"train-lm-{machine}.png")
        return 0
    if args.d_model % args.heads:
        parser.error(f"--d-model ({args.d_model}) must be a multiple of --heads ({args.heads})")
    env = environment()
    env["settings"] = settings(args) | {"device": args.device}

    def save_rows(rows):  # after each evaluation: a run cut short keeps its rows so far
        return write_results(args.out, env, f"train_{args.attention}", rows)

    rows, finished = train(args, save_rows)
    if not finished:
        return 3
    print(f"final validation loss {rows[-1]['validation_loss']:.4f}; wrote {save_rows(rows)}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
