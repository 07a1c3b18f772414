"""Call B: q_tiles_check.py's call (two Q tiles, 64 x 89 tokens, 4 heads) through the debug kernel that
make_debug_kernel.py writes: compares what each consumer saw at each of its program's tiles (tile number, Q slot,
ring position, checksums of the Q, K and V tiles) with what the loader copied and with the inputs, and what it
computed (its normalized output's sum, before the store) with a float64 reference and with what the output holds.
argv: "one" for one Q tile (control)."""
import sys
from collections import Counter

import torch

sys.path.insert(0, "benchmarks")
from module_file import load_module_file  # noqa: E402

import flashattn.kernels.forward_hopper as current  # noqa: E402
from flashattn import flash_attn_func, launcher, ops  # noqa: E402

BATCH, SEQLEN, HEADS, HDIM, ROUNDS = 64, 89, 4, 128, 32
debug_kernel = load_module_file("scratch/forward_hopper_debug.py", "debug").attention_forward_hopper_kernel
if "one" not in sys.argv[1:]:
    tree_rule = ops._forward_q_buffers
    ops._forward_q_buffers = lambda config, head_dim, is_varlen, seqlen_k: tree_rule(config, head_dim, False, 4096)
programs = torch.cuda.get_device_properties(0).multi_processor_count
debug = torch.full((programs, ROUNDS, 5, 16), -1.0, device="cuda")


class WithDebug:
    """The debug kernel launched with the buffer as its one extra argument."""

    def __getitem__(self, grid):
        assert grid[0] <= programs
        return lambda *args, **kwargs: debug_kernel[grid](*args, Debug=debug, **kwargs)


current.attention_forward_hopper_kernel = WithDebug()
launcher.clear_plans()
torch.manual_seed(1)
q, k, v = (torch.randn(BATCH, SEQLEN, HEADS, HDIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
expected = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2).float() for x in (q, k, v)))
out = flash_attn_func(q, k, v)
torch.cuda.synchronize()
error = (out.float() - expected.transpose(1, 2)).abs()
wrong = ((error.amax(dim=(1, 3)) > 0.05) | error.isnan().any(dim=3).any(dim=1)).sum().item()
print(f"{' '.join(sys.argv[1:]) or 'two Q tiles'}: {wrong} wrong pairs of {BATCH * HEADS}")

rows_q, rows_k, rows_v, out_rows = (x.reshape(BATCH * SEQLEN, HEADS * HDIM).float().cpu() for x in (q, k, v, out))


def tile_sum(matrix, first, count, head):
    block = matrix[max(first, 0):max(min(first + count, matrix.shape[0]), 0), head * HDIM:(head + 1) * HDIM]
    return block.sum().item()


records = debug.cpu()
plans = {}  # tile -> the loader's (q_start, tile_row, head, head_k)
for program in range(programs):
    for round_ in range(ROUNDS):
        tile, slot, ring, n_blocks, q_start, tile_row, head, head_k = records[program, round_, 2, :8].tolist()
        if tile >= 0:
            plans[int(tile)] = (int(q_start), int(tile_row), int(head), int(head_k))
print(f"loader records: {len(plans)} tiles")
problems = Counter()
shown = 0
for program in range(programs):
    for round_ in range(ROUNDS):
        loader = records[program, round_, 2].tolist()
        for consumer in range(2):
            tile, slot, ring, n_blocks, own_full, own_blocks, q_sum, k_sum, v_sum, first_row = \
                records[program, round_, consumer, :10].tolist()
            if tile < 0:
                continue
            notes = []
            if loader[0] < 0 or int(loader[0]) != int(tile) or loader[1] != slot or loader[2] != ring:
                notes.append(f"loader had tile {loader[0]:.0f} slot {loader[1]:.0f} ring {loader[2]:.0f}")
            plan = plans.get(int(tile))
            if plan is None:
                notes.append("no loader record of this tile")
            else:
                q_start, tile_row, head, head_k = plan
                k_start = q_start  # dense, seqlen_q == seqlen_k
                want = (tile_sum(rows_q, q_start + tile_row + 64 * consumer, 64, head),
                        tile_sum(rows_k, k_start, 128, head_k), tile_sum(rows_v, k_start, 128, head_k))
                for name, got, exp in zip("QKV", (q_sum, k_sum, v_sum), want, strict=True):
                    if abs(got - exp) > 0.05 + 1e-3 * abs(exp):
                        notes.append(f"{name} sum {got:.3f} expected {exp:.3f}")
            computed = records[program, round_, 3 + consumer, :7].tolist()
            o_sum, o_abs, l_sum, m_max, t_before, t_first, t_after = computed
            seqlens_used = records[program, round_, 3 + consumer, 7:9].tolist()
            if plan is not None:
                rows = q_start + tile_row + 64 * consumer + torch.arange(64)
                queries = torch.zeros(64, HDIM, dtype=torch.float64)
                inside = rows < BATCH * SEQLEN
                queries[inside] = rows_q[rows[inside], head * HDIM:(head + 1) * HDIM].double()
                keys = rows_k[k_start:k_start + SEQLEN, head_k * HDIM:(head_k + 1) * HDIM].double()
                values = rows_v[k_start:k_start + SEQLEN, head_k * HDIM:(head_k + 1) * HDIM].double()
                reference = torch.softmax(queries @ keys.T / HDIM ** 0.5, dim=-1) @ values
                scores = queries @ keys.T / HDIM ** 0.5
                l_masked = torch.exp(scores - scores.amax(-1, keepdim=True)).sum().item()
                # the whole 128-key block unmasked: its rows past this sequence (the next one's; zeros past the tensor)
                block_rows = torch.arange(k_start, k_start + 128)
                block_keys = torch.zeros(128, HDIM, dtype=torch.float64)
                block_values = torch.zeros(128, HDIM, dtype=torch.float64)
                kept = block_rows < BATCH * SEQLEN
                block_keys[kept] = rows_k[block_rows[kept], head_k * HDIM:(head_k + 1) * HDIM].double()
                block_values[kept] = rows_v[block_rows[kept], head_k * HDIM:(head_k + 1) * HDIM].double()
                block_scores = queries @ block_keys.T / HDIM ** 0.5
                l_unmasked = torch.exp(block_scores - block_scores.amax(-1, keepdim=True)).sum().item()
                unmasked = torch.softmax(block_scores, dim=-1) @ block_values
                if program < 2:
                    print(f"  l sum {l_sum:.2f} (masked reference {l_masked:.2f}, unmasked {l_unmasked:.2f}); O sums "
                          f"{o_sum:.3f} / {o_abs:.3f} (masked {reference.sum().item():.3f} / "
                          f"{reference.abs().sum().item():.3f}, unmasked {unmasked.sum().item():.3f} / "
                          f"{unmasked.abs().sum().item():.3f})")
                if abs(o_sum - reference.sum().item()) > 0.05 or abs(o_abs - reference.abs().sum().item()) > 0.5:
                    notes.append(f"O sums {o_sum:.3f} / {o_abs:.3f} expected {reference.sum().item():.3f} / "
                                 f"{reference.abs().sum().item():.3f} (l sum {l_sum:.2f}, max m {m_max:.2f})")
                stored_rows = rows[(rows >= q_start) & (rows < q_start + SEQLEN)]
                stored = out_rows[stored_rows, head * HDIM:(head + 1) * HDIM]
                local = stored_rows - rows[0]
                if (stored.double() - reference[local]).abs().max() > 0.05:
                    notes.append("output rows differ from the reference")
                if seqlens_used != [SEQLEN, SEQLEN]:
                    notes.append(f"lengths used {seqlens_used}")
            if program < 2:
                print(f"program {program} round {round_} consumer {consumer}: product issues {t_before:.0f} -> "
                      f"{t_first:.0f} (first call) -> {t_after:.0f} (second), lengths {seqlens_used}")
            for note in notes:
                problems[note.split(" ")[0]] += 1
            if notes and shown < 30:
                shown += 1
                print(f"program {program} round {round_} consumer {consumer} tile {tile:.0f} slot {slot:.0f} "
                      f"ring {ring:.0f} blocks {n_blocks:.0f}/{own_full:.0f}/{own_blocks:.0f}: " + "; ".join(notes))
print("problems by kind:", dict(problems))
rounds_done = (records[:, :, 0, 0] >= 0).sum(dim=1)
print("tiles a program:", Counter(rounds_done.tolist()))
