"""Context parallelism (``flashattn.distributed``): the zigzag layouts (dense and packed) and each step's calls on
one process, then the ring, the all-to-all mode, the packed form and ``SelfAttention`` over a group in spawned
process groups (gloo, on the CPU path), held to flash-attn's rule against the float64 reference on the full
sequence (``ring_cases.py``).

CI runs one group of 2 processes and one of 4, each through its list of cases; FLASHATTN_RING_FULL=1 adds every
option in every dtype (and a group of 3). The ``gpu`` tests run the cases at real sizes over NCCL on 2 (and 4) GPUs.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ring_cases
import torch

from flashattn import all_to_all, head_parallel, masks, ring_varlen
from flashattn.options import AttentionOptions
from flashattn.ring import Ring, ZigzagLayout, step_pieces
from flashattn.ring_varlen import PackedCall, PackedLayout, plan

# the spawning tests take turns across pytest-xdist workers (tests/conftest.py): each group fills the cores itself
SPAWN_GROUP = "ring-processes"


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("seqlen", [1, 5, 16, 23, 64, 101])
def test_zigzag_layout_cuts_the_sequence_into_2w_balanced_chunks(world_size, seqlen):
    layout = ZigzagLayout(seqlen, world_size)
    lengths = [layout.chunk_length(c) for c in range(2 * world_size)]
    assert sum(lengths) == seqlen and max(lengths) - min(lengths) <= 1
    assert [layout.chunk_start(c) for c in range(2 * world_size)] == [sum(lengths[:c]) for c in range(len(lengths))]
    for rank in range(world_size):
        (_, first), (_, second) = layout.chunks(rank)
        assert first + second == layout.rank_length(rank)
        assert layout.chunks(rank)[1][0] == layout.chunk_start(2 * world_size - 1 - rank)
    assert sum(layout.rank_length(r) for r in range(world_size)) == seqlen


def _global_positions(layout: ZigzagLayout, rank: int) -> torch.Tensor:
    (first_start, first_len), (second_start, second_len) = layout.chunks(rank)
    return torch.cat((torch.arange(first_start, first_start + first_len),
                      torch.arange(second_start, second_start + second_len)))


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (3, 0), (2, 5), (-1, 4)])
@pytest.mark.parametrize("framed", [False, True])
@pytest.mark.parametrize("world_size,seqlen", [(2, 16), (3, 20), (4, 37), (4, 5)])
def test_ring_steps_cover_each_visible_score_once(world_size, seqlen, window, framed):
    """Over the W steps of every rank, the calls' (query, key) pairs are exactly the visible pairs of the full
    sequence, each once: the step kinds without frames (causal or no mask), and the framed pairs of chunks."""
    if not framed and window not in ((-1, -1), (-1, 0)):
        return  # windows always take frames
    layout = ZigzagLayout(seqlen, world_size)
    opts = AttentionOptions(1.0, *window)
    covered = torch.zeros(seqlen, seqlen, dtype=torch.int64)
    for rank in range(world_size):
        ring = Ring(None, rank, world_size, layout)
        rows_global = _global_positions(layout, rank)
        for step in range(world_size):
            src = ring.source(step)
            keys_global = _global_positions(layout, src)
            for piece in step_pieces(ring, src, opts, framed):
                q_pos, k_pos = rows_global[piece.rows], keys_global[piece.keys]
                shift = piece.opts.diagonal_shift(len(q_pos), len(k_pos))
                local = masks.visible(torch.arange(len(q_pos)).view(-1, 1), torch.arange(len(k_pos)).view(1, -1),
                                      len(q_pos), len(k_pos), piece.opts.window_left, piece.opts.window_right, shift)
                covered[q_pos.view(-1, 1), k_pos.view(1, -1)] += local.expand(len(q_pos), len(k_pos)).long()
    expected = masks.visible(torch.arange(seqlen).view(-1, 1), torch.arange(seqlen).view(1, -1), seqlen, seqlen,
                             *window)
    assert torch.equal(covered, expected.expand(seqlen, seqlen).long())


def _runs_positions(runs) -> torch.Tensor:
    return torch.cat([torch.arange(start, start + length) for start, length in runs] or [torch.arange(0)])


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_packed_layout_keeps_short_sequences_whole_and_balances_ranks(world_size):
    """Sequences with more than WHOLE_SHARE of a rank's even attention are cut; the others stay whole, each on one
    rank, and no rank's tokens pass WHOLE_SHARE over the even count; every rank sends exactly its cut parts."""
    generator = torch.Generator().manual_seed(world_size)
    seqlens = tuple(int(n) for n in torch.empty(300).log_normal_(6.0, 1.0, generator=generator).clamp(1, 20000))
    layout = PackedLayout(seqlens, world_size)
    even_cost, even_tokens = sum(n * n for n in seqlens) / world_size, sum(seqlens) / world_size
    for b, owner in enumerate(layout.owners):
        if owner is not None:
            assert seqlens[b] ** 2 <= ring_varlen.WHOLE_SHARE * even_cost
    assert any(owner is None for owner in layout.owners) and any(owner is not None for owner in layout.owners)
    for rank in range(world_size):
        assert layout.rank_length(rank) <= (1 + ring_varlen.WHOLE_SHARE) * even_tokens + 2 * len(seqlens)
        cut = [b for b, owner in enumerate(layout.owners) if owner is None]
        assert layout.sent_length(rank) == sum(length for b in cut for _, length in layout.chunks(b, rank))
        positions = _runs_positions(layout.runs(rank))  # what it sends comes first
        starts = layout.starts()
        first = positions[:layout.sent_length(rank)]
        assert all(any(starts[b] <= p < starts[b + 1] for b in cut) for p in first.tolist()[:50])
    assert PackedLayout(seqlens, world_size).owners == layout.owners  # every rank places alike


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (3, 0), (2, 5)])
@pytest.mark.parametrize("world_size,seqlens", [(2, (7, 1, 12, 5)), (3, (13, 0, 6)), (4, (3, 17, 9)),
                                                (2, ring_cases.MIXED), (4, (*ring_cases.MIXED, 4, 3)),
                                                (2, (2,) * 20), (2, (1,)), (8, (5, 3))])
def test_packed_ring_steps_cover_each_visible_score_once(world_size, seqlens, window):
    """The packed ring's calls, one varlen call a step (segments that face an empty side skipped) or framed pairs of
    chunks, cover every visible (query, key) pair of every sequence exactly once, and nothing across sequences."""
    layout = PackedLayout(seqlens, world_size)
    total, starts = layout.seqlen, layout.starts()
    opts = AttentionOptions(1.0, *window)
    framed = window not in ((-1, -1), (-1, 0))
    covered = torch.zeros(total, total, dtype=torch.int64)
    assert sorted(_runs_positions([r for rank in range(world_size) for r in layout.runs(rank)]).tolist()) == list(
        range(total))

    def add(q_pos, k_pos, call_opts):
        shift = call_opts.diagonal_shift(len(q_pos), len(k_pos))
        seen = masks.visible(torch.arange(len(q_pos)).view(-1, 1), torch.arange(len(k_pos)).view(1, -1), len(q_pos),
                             len(k_pos), call_opts.window_left, call_opts.window_right, shift)
        covered[q_pos.view(-1, 1), k_pos.view(1, -1)] += seen.expand(len(q_pos), len(k_pos)).long()

    for rank in range(world_size):
        ring = Ring(None, rank, world_size, layout)
        rows_global = _runs_positions(layout.runs(rank))
        for step in range(world_size):
            src = ring.source(step)
            keys_global = _runs_positions(layout.runs(src))  # what travels: the first sent_length tokens
            keys_global = keys_global if src == rank else keys_global[:layout.sent_length(src)]
            for call in plan(ring, opts, framed, torch.device("cpu"))[step]:
                if isinstance(call, PackedCall):
                    # the call's rows: every local row at the own step, else the cut sequences' (a prefix)
                    cu_q, cu_k = call.cu_seqlens_q.tolist(), call.cu_seqlens_k.tolist()
                    rows = rows_global[call.rows]
                    assert call.rows.start == 0
                    assert len(rows) == (len(rows_global) if src == rank else layout.sent_length(rank))
                    assert cu_q[-1] == len(rows) and cu_k[-1] == len(keys_global)
                    for i in range(len(cu_q) - 1):
                        add(rows[cu_q[i]:cu_q[i + 1]], keys_global[cu_k[i]:cu_k[i + 1]], call.opts)
                else:
                    add(rows_global[call.rows], keys_global[call.keys], call.opts)
    expected = torch.zeros(total, total, dtype=torch.int64)
    for start, n in zip(starts, seqlens, strict=False):
        expected[start:start + n, start:start + n] = masks.visible(
            torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1), n, n, *window).expand(n, n).long()
    assert torch.equal(covered, expected)


@pytest.mark.parametrize("layout", [ZigzagLayout(21, 2), ZigzagLayout(30, 3), PackedLayout((40, 3, 5, 2, 4, 6, 1), 2),
                                    PackedLayout((7, 12, 1, 9), 3)], ids=repr)
@pytest.mark.parametrize("batch", [1, 3])
def test_head_exchange_rows_put_every_ranks_tokens_in_place(layout, batch):
    """``HeadExchange.rows``: the receive buffer of the all-to-all (rank r's (batch, tokens) block after the
    ranks before it, each in its rank's order) gathered by it is every sequence in its natural order, and scattered
    by it the natural order goes back into those blocks."""
    exchange = all_to_all.HeadExchange.of(Ring(None, 0, layout.world_size, layout), torch.device("cpu"), batch)
    total = layout.seqlen
    natural = torch.arange(batch)[:, None] * total + torch.arange(total)[None, :]  # (b, p) -> b * N + p
    blocks = torch.cat([natural[:, torch.tensor([p for start, n in layout.runs(rank)
                                                 for p in range(start, start + n)], dtype=torch.int64)].reshape(-1)
                        for rank in range(layout.world_size)])
    rows = exchange.rows
    assert torch.equal(blocks[rows], natural.reshape(-1))
    assert sorted(rows.tolist()) == list(range(batch * total))
    assert torch.equal(rows[exchange.sources], torch.arange(batch * total))


@pytest.mark.parametrize("deterministic", [False, True])
def test_ring_steps_take_the_callers_deterministic(deterministic, monkeypatch):
    """Each step's backward call gets the caller's ``deterministic`` (on Hopper: the two passes or the fused one), and
    a one-rank ring's gradients are the single call's, bit for bit. The CPU path is deterministic either way, so the
    flag is read off the op's arguments."""
    from flashattn import flash_attn_func, ops, ring

    flags = []
    eager_call = ops.eager_call

    def recording(op, cuda_op, *arguments):
        if op is ops.attention_backward:
            flags.append(arguments[-1])
        return eager_call(op, cuda_op, *arguments)

    monkeypatch.setattr(ops, "eager_call", recording)
    q, k, v, dout = (torch.randn(1, 40, 2, 16) for _ in range(4))
    opts = AttentionOptions.build(16, None, True, (-1, -1), 0.0, 0.0, deterministic)
    one_rank = Ring(None, 0, 1, ZigzagLayout(40, 1))
    out, lse = ring.forward(q, k, v, None, None, opts, one_rank)
    grads = ring.backward(dout, q, k, v, out, lse, None, None, opts, one_rank)
    assert flags and all(flag is deterministic for flag in flags)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(flash_attn_func(*leaves, causal=True), leaves, dout)
    for got, expected in zip(grads, want, strict=True):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("nheads_k, ranks, seqlen, expected", [
    (8, 2, 65536, "all_to_all"), (8, 2, 65535, "ring"), (8, 4, 131072, "all_to_all"), (8, 4, 65536, "ring"),
    (6, 4, 1 << 20, "ring"), (1, 2, 1 << 20, "ring")])
def test_auto_mode_takes_the_all_to_all_from_32k_tokens_a_rank_when_the_heads_divide(nheads_k, ranks, seqlen,
                                                                                     expected):
    assert head_parallel.choose_mode("auto", nheads_k, ranks, seqlen) == expected
    assert head_parallel.choose_mode("ring", nheads_k, ranks, seqlen) == "ring"
    assert head_parallel.choose_mode("auto", nheads_k, ranks, seqlen, packed=True) == "ring"  # packed: the ring


def test_modes_that_cannot_run_are_refused_by_name():
    with pytest.raises(ValueError, match="mode='all_to_all'.*divide"):
        head_parallel.choose_mode("all_to_all", 6, 4, 1 << 20)
    with pytest.raises(ValueError, match="mode must be one of"):
        head_parallel.choose_mode("ulysses", 8, 2, 1 << 20)


@pytest.mark.xdist_group(SPAWN_GROUP)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_attention_over_gloo(world_size, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    ring_cases.spawn(world_size, "gloo", ring_cases.smoke_cases(world_size), str(tmp_path))


@pytest.mark.xdist_group(SPAWN_GROUP)
@pytest.mark.skipif(not os.environ.get("FLASHATTN_RING_FULL"), reason="the full matrix: FLASHATTN_RING_FULL=1")
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_ring_attention_over_gloo_full_matrix(world_size, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    ring_cases.spawn(world_size, "gloo", ring_cases.full_cases(world_size), str(tmp_path))


@pytest.mark.xdist_group(SPAWN_GROUP)
@pytest.mark.skipif(not os.environ.get("FLASHATTN_RING_FULL"), reason="the full matrix: FLASHATTN_RING_FULL=1")
def test_train_context_parallel_script_under_torchrun(tmp_path):
    """The script as users run it (the CI groups call its ``train``): both final losses, equal within 1e-4."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root / "src"), FLASHATTN_BACKEND="torch", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(root / "benchmarks" / "train_context_parallel.py"), "--steps", "5", "--tolerance", "1e-4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "context-parallel (2 ranks, mode ring)" in result.stdout and "single process" in result.stdout


@pytest.mark.gpu
@pytest.mark.xdist_group(SPAWN_GROUP)
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ring_attention_over_nccl(world_size, tmp_path):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs")
    ring_cases.spawn(world_size, "nccl", ring_cases.gpu_cases(world_size), str(tmp_path))

