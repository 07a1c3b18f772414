"""A/B timing of two source trees: the same cases, each side in processes of its own, round after round.

    python benchmarks/ab_trees.py main HEAD                          # git revisions: their src/ exported
    python benchmarks/ab_trees.py /tmp/tree-a /tmp/tree-b            # folders that hold a src/
    python benchmarks/ab_trees.py main HEAD --cases "fwd d128 b4 s4000 h16" "decode d128 b4 c8192 h32/8"

(A machine whose copy of the checkout lacks its git history takes folders: ``git archive REV src | tar x -C DIR``
where the history is, and the folders copied along.)

A case is words: its kind (``fwd``, ``bwd``, ``varlen`` (a packed forward), ``decode``), then ``d`` head dim, ``b``
batch, ``s`` sequence length, ``h`` heads (``h32/8``: 32 query heads, 8 kv heads), ``causal``; ``varlen`` takes
``l4000x4`` (four sequences of 4000) instead of ``b`` and ``s``; ``decode`` takes ``c`` the cache's capacity (its
lengths capacity - 37, so that the last block is partly filled) and ``n`` new keys appended by the step. ``fwd``,
``bwd`` and ``varlen`` also take the options that route a call to the Triton tile: ``softcap`` (30), ``alibi``
(slopes 2^-1 .. 2^-8 over the heads) and ``w256`` (a window of 256 keys each side; the rate counts the FLOPs of
the unwindowed call); ``fwd`` and ``bwd`` take ``sliced`` (q, k and v the first ``s`` tokens of longer buffers, as a
cache's first keys). Without ``--cases`` a list that covers the dense, packed, backward and decode paths at lengths
on and off the block grid.

Each round runs every case in a fresh process of tree A, then of tree B, the order swapped every other round, so that
a drift of the GPU's clocks over the run favours neither side. The table gives each side's median over the rounds
(TFLOP/s; GB/s of cache read for decode), their ratio B / A and each round's ratio. Run it with the GPU otherwise idle:
between runs a ratio moves by about 2%, so a target counts as met at 0.98 of it in two runs of three.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_CASES = (
    "fwd d128 b4 s4000 h16", "fwd d128 b4 s4000 h16 causal", "fwd d256 b4 s4000 h8", "fwd d64 b4 s4000 h32",
    "fwd d128 b4 s4096 h16", "fwd d128 b16 s1024 h16 causal", "fwd d128 b1 s16384 h16 causal",
    "bwd d128 b4 s4000 h16", "bwd d128 b4 s4096 h16", "bwd d64 b1 s16384 h32 causal", "bwd d256 b16 s1000 h8 causal",
    "varlen d128 l4000x4 h16", "varlen d128 l1000x16 h16 causal",
    "decode d128 b4 c8192 h32/8", "decode d128 b1 c16384 h32/8 n1", "decode d64 b8 c4096 h32/8",
)


@dataclass(frozen=True)
class Case:
    """One timed call: what ``parse_case`` reads from a case's words."""

    text: str
    kind: str
    head_dim: int
    batch: int = 1
    seqlen: int = 0
    heads: int = 1
    kv_heads: int = 1
    causal: bool = False
    lengths: tuple[int, ...] = ()
    capacity: int = 0
    new_keys: int = 0
    window: int = -1
    softcap: bool = False
    alibi: bool = False
    sliced: bool = False


_WORD = re.compile(r"(d|b|s|c|n|w)(\d+)$|h(\d+)(?:/(\d+))?$|l(\d+)x(\d+)$|(causal|softcap|alibi|sliced)$")


def parse_case(text: str) -> Case:
    """The Case of ``text`` (the module docstring's words); a word it does not know raises ValueError naming it."""
    kind, *words = text.split()
    if kind not in ("fwd", "bwd", "varlen", "decode"):
        raise ValueError(f"case {text!r}: the kind must be fwd, bwd, varlen or decode, not {kind!r}")
    fields: dict = {}
    names = {"d": "head_dim", "b": "batch", "s": "seqlen", "c": "capacity", "n": "new_keys", "w": "window"}
    for word in words:
        match = _WORD.match(word)
        if match is None:
            raise ValueError(f"case {text!r}: unknown word {word!r}")
        letter, number, heads, kv_heads, length, count, flag = match.groups()
        if letter:
            fields[names[letter]] = int(number)
        elif heads:
            fields["heads"] = int(heads)
            fields["kv_heads"] = int(kv_heads or heads)
        elif length:
            fields["lengths"] = (int(length),) * int(count)
        else:
            fields[flag] = True
    if "head_dim" not in fields:
        raise ValueError(f"case {text!r}: no head dim (d...)")
    needs = {"fwd": "seqlen", "bwd": "seqlen", "varlen": "lengths", "decode": "capacity"}[kind]
    if needs not in fields:
        raise ValueError(f"case {text!r}: a {kind} case needs {needs}")
    options = [name for name in ("window", "softcap", "alibi") if name in fields]
    if kind == "decode" and options:
        raise ValueError(f"case {text!r}: a decode case takes no {options[0]}")
    if kind not in ("fwd", "bwd") and "sliced" in fields:
        raise ValueError(f"case {text!r}: a {kind} case takes no sliced")
    return Case(text, kind, **fields)


def _runner(case: Case, device):
    """(the call to time, what it counts: FLOPs, or bytes of cache read for decode)."""
    import torch

    from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from flashattn.flops import backward_flops, forward_flops

    dtype = torch.bfloat16

    def randn(*shape, grad=False):
        if case.sliced:  # the first seqlen tokens of buffers 128 tokens longer
            batch, seqlen, *rest = shape
            return torch.randn(batch, seqlen + 128, *rest, device=device, dtype=dtype)[:, :seqlen].requires_grad_(grad)
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    d = case.head_dim
    options = {"causal": case.causal}
    if case.window >= 0:
        options["window_size"] = (case.window, case.window)
    if case.softcap:
        options["softcap"] = 30.0
    if case.alibi:
        options["alibi_slopes"] = torch.logspace(-1, -8, case.heads, base=2.0, device=device, dtype=torch.float32)
    if case.kind in ("fwd", "bwd"):
        backward = case.kind == "bwd"
        q = randn(case.batch, case.seqlen, case.heads, d, grad=backward)
        k, v = (randn(case.batch, case.seqlen, case.kv_heads, d, grad=backward) for _ in range(2))
        flops = forward_flops(case.batch, case.seqlen, case.seqlen, case.heads, d, case.causal)
        if not backward:
            return (lambda: flash_attn_func(q, k, v, **options)), flops
        out = flash_attn_func(q, k, v, **options)
        grad = torch.randn_like(out)
        flops = backward_flops(case.batch, case.seqlen, case.seqlen, case.heads, d, case.causal)
        return (lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)), flops
    if case.kind == "varlen":
        total = sum(case.lengths)
        q = randn(total, case.heads, d)
        k, v = (randn(total, case.kv_heads, d) for _ in range(2))
        cu = torch.tensor([0, *torch.tensor(case.lengths).cumsum(0).tolist()], device=device, dtype=torch.int32)
        longest = max(case.lengths)
        flops = sum(forward_flops(1, n, n, case.heads, d, case.causal) for n in case.lengths)
        return (lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, **options)), flops
    k_cache, v_cache = (randn(case.batch, case.capacity, case.kv_heads, d) for _ in range(2))
    q = randn(case.batch, 1, case.heads, d)
    lengths = torch.full((case.batch,), case.capacity - 37 - case.new_keys, device=device, dtype=torch.int32)
    new = [randn(case.batch, case.new_keys, case.kv_heads, d) for _ in range(2)] if case.new_keys else [None, None]
    cache_bytes = 2 * k_cache.numel() * k_cache.element_size()
    return (lambda: flash_attn_with_kvcache(q, k_cache, v_cache, *new, cache_seqlens=lengths, causal=True)), cache_bytes


def measure(texts: list[str], device_name: str) -> list[dict]:
    """Each case's time and rate on this process's flashattn (the worker's side of a round)."""
    import torch

    import flashattn
    from flashattn.tools.timing import time_call

    # an installed flashattn (an editable install's import hook) must not stand in for the tree's
    tree = Path(os.environ.get("AB_TREE", "/")).resolve()
    if not Path(flashattn.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"imported {flashattn.__file__}, not the flashattn under {tree}")
    device = torch.device(device_name)
    torch.manual_seed(0)
    rows = []
    for text in texts:
        case = parse_case(text)
        call, work = _runner(case, device)
        seconds = time_call(call, device).seconds
        unit = "GB/s" if case.kind == "decode" else "TFLOP/s"
        rows.append({"case": text, "ms": seconds * 1e3, "rate": work / seconds / (1e9 if unit == "GB/s" else 1e12),
                     "unit": unit})
    return rows


def source_tree(spec: str, workdir: Path) -> Path:
    """The folder whose src/ a side imports: ``spec`` itself where it is a folder holding src/, else a git revision
    of this repository, its src/ exported into ``workdir``."""
    path = Path(spec)
    if (path / "src").is_dir():
        return path.resolve()
    target = workdir / re.sub(r"[^\w.-]", "_", spec)
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", spec, "src"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"{spec!r} is neither a folder holding src/ nor a git revision: "
                         f"{archive.stderr.decode().strip()}")
    subprocess.run(["tar", "x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def run_side(tree: Path, texts: list[str], device: str) -> dict[str, dict]:
    """One round of one side: a fresh process importing ``tree``'s flashattn."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "AB_TREE": str(tree)}
    done = subprocess.run([sys.executable, __file__, "--worker", "--device", device, "--cases", *texts], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the worker on {tree} failed:\n{done.stderr[-3000:]}")
    return {row["case"]: row for row in map(json.loads, done.stdout.splitlines())}


def table(texts: list[str], rounds: list[tuple[dict, dict]], names: tuple[str, str]) -> str:
    """Each case's medians over the rounds, B / A, and each round's ratio."""
    width = max(len(text) for text in texts)
    lines = [f"A: {names[0]}   B: {names[1]}   ({len(rounds)} rounds)",
             f"{'case':{width}s} {'unit':>7s} {'A':>9s} {'B':>9s}  B / A  each round's"]
    for text in texts:
        a = [side_a[text]["rate"] for side_a, _ in rounds]
        b = [side_b[text]["rate"] for _, side_b in rounds]
        per_round = " ".join(f"{y / x:.3f}" for x, y in zip(a, b, strict=True))
        median_a, median_b = statistics.median(a), statistics.median(b)
        lines.append(f"{text:{width}s} {rounds[0][0][text]['unit']:>7s} {median_a:9.5g} {median_b:9.5g}  "
                     f"{median_b / median_a:.3f}  [{per_round}]")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="tree A and tree B: git revisions or folders holding src/")
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), help="cases, each one quoted string")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, help="also write every round's rows here as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for text in args.cases:
        parse_case(text)  # a bad case fails here, before any process starts
    if args.worker:
        for row in measure(args.cases, args.device):
            print(json.dumps(row), flush=True)
        return 0
    if len(args.trees) != 2:
        parser.error("give two trees: A and B")
    with tempfile.TemporaryDirectory() as workdir:
        trees = [source_tree(spec, Path(workdir) / str(i)) for i, spec in enumerate(args.trees)]
        rounds = []
        for index in range(args.rounds):
            order = (0, 1) if index % 2 == 0 else (1, 0)
            sides = {side: run_side(trees[side], args.cases, args.device) for side in order}
            rounds.append((sides[0], sides[1]))
    if args.out:
        args.out.write_text(json.dumps({"trees": args.trees, "rounds": rounds}, indent=1))
    print(table(args.cases, rounds, tuple(args.trees)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
