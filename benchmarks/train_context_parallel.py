"""Train the README's tiny model context-parallel, and the same model on one process from the same seed.

    torchrun --nproc-per-node 2 benchmarks/train_context_parallel.py [--steps 60] [--mode ring|all_to_all|auto]
    python benchmarks/train_context_parallel.py                  # the single process only

The model is the README's ``TinyLM`` (flashattn.nn.SelfAttention blocks: causal, rotary, GQA), the task the
README's: repeat a random sequence of 16 tokens. Under torchrun (gloo on CPUs, NCCL on GPUs) every rank holds the
zigzag shard (``flashattn.distributed.shard``) of each batch's 31-token sequences, its blocks run context-parallel
over the group (``SelfAttention(process_group=...)``, rotary at the global positions), each rank's loss is its
part of the whole batch's mean, and the gradients are summed over the group before each step. Rank 0 then trains
the same model on one process from the same seed, on the same batches, and prints both final losses: they differ
only by the rounding of the two orders of computation. ``--tolerance`` makes a larger difference an error.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from flashattn.distributed import shard
from flashattn.nn import SelfAttention

VOCAB, HALF = 32, 16  # the README's task: a random sequence of 16 tokens out of 32, repeated


class TinyLM(nn.Module):
    """The README's model; with a ``process_group``, its attention runs context-parallel."""

    def __init__(self, vocab=VOCAB, dim=64, layers=2, process_group=None, mode="ring"):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.attns = nn.ModuleList(SelfAttention(dim, num_heads=4, num_kv_heads=2, process_group=process_group,
                                                 context_parallel_mode=mode) for _ in range(layers))
        self.process_group = process_group

    def forward(self, tokens, seqlen=None):  # (batch, seqlen) -> (batch, seqlen, vocab); local shards in parallel
        context = {} if self.process_group is None else {"seqlen": seqlen}
        x = self.embed(tokens)
        for norm, attn in zip(self.norms, self.attns, strict=True):
            x = x + attn(norm(x), **context)
        return self.head(x)


def train(steps: int, group=None, mode: str = "ring", seed: int = 0, device=None, batch: int = 16) -> list[float]:
    """The losses of ``steps`` AdamW steps, each of the whole batch (every rank reports the whole batch's loss)."""
    device = torch.device(device or "cpu")
    torch.manual_seed(seed)
    model = TinyLM(process_group=group, mode=mode).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    seqlen = 2 * HALF - 1
    losses = []
    for _ in range(steps):
        half = torch.randint(0, VOCAB, (batch, HALF))
        tokens = torch.cat([half, half], dim=1).to(device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        # the README's loss: the mean over the second half's predictions (positions HALF .. seqlen - 1)
        weights = (torch.arange(seqlen, device=device) >= HALF).float() / (batch * (seqlen - HALF))
        if group is not None:
            inputs, targets = shard(inputs, group), shard(targets, group)
            weights = shard(weights, group, dim=0)
        logits = model(inputs, seqlen)
        losses_per_token = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        loss = (losses_per_token.view(targets.shape) * weights).sum()
        optimizer.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        if group is not None:  # each rank's loss is a part of the whole: sum the parts and their gradients
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad, group=group)
            dist.all_reduce(total, group=group)
        optimizer.step()
        losses.append(total.item())
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--mode", choices=("ring", "all_to_all", "auto"), default="ring")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=None,
                        help="exit 1 when the two final losses differ by more than this")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:
        single = train(args.steps, None, args.mode, args.seed, device)
        print(f"single process: loss {single[0]:.4f} -> {single[-1]:.4f}")
        return 0
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=10))
    try:
        parallel = train(args.steps, dist.group.WORLD, args.mode, args.seed, device)
        world_size, rank = dist.get_world_size(), dist.get_rank()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    single = train(args.steps, None, args.mode, args.seed, device)
    difference = abs(parallel[-1] - single[-1])
    print(f"context-parallel ({world_size} ranks, mode {args.mode}): loss {parallel[0]:.4f} -> {parallel[-1]:.6f}")
    print(f"single process:                       loss {single[0]:.4f} -> {single[-1]:.6f}")
    print(f"final losses differ by {difference:.2e}")
    return 1 if args.tolerance is not None and difference > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())
