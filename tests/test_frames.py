"""Position frames (``options.PositionFrame``): a call placed in a larger problem, as ring attention's steps are.
Masks, ALiBi and the dropout stream must follow the larger problem's positions, on the PyTorch path and in the
Triton kernels alike."""

import pytest
import torch
from cases import make_case

from flashattn import flash_attn_combine, ops, testing
from flashattn.options import AttentionOptions, PositionFrame, new_rng_state

FRAME_CASES = [  # (seqlen, nheads, nheads_k, head_dim, OPTIONS name, dtype): the options whose scores move with it
    (37, 2, 1, 32, "window", torch.float32),
    (29, 2, 2, 40, "causal-alibi-softcap", torch.float16),
    (33, 2, 1, 32, "window-dropout-scale", torch.float32),
    (26, 4, 2, 16, "dropout", torch.float16),
]


def _framed_run(query_cut: int, key_cut: int):
    """``run`` for ``check_run_against_reference``: the call as four framed calls (queries cut at query_cut, keys
    at key_cut), merged by flash_attn_combine; the backward as four framed backward calls from the merged out and
    lse, as a ring step computes them."""
    def run(q, k, v, options):
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        opts = AttentionOptions.build(q.shape[-1], options.get("softmax_scale"), options.get("causal", False),
                                      options.get("window_size", (-1, -1)), options.get("softcap", 0.0),
                                      options.get("dropout_p", 0.0), False)
        slopes = options.get("alibi_slopes")
        rng_state = new_rng_state() if opts.dropout_p > 0 else None
        row_blocks = (slice(0, query_cut), slice(query_cut, seqlen_q))
        key_blocks = (slice(0, key_cut), slice(key_cut, seqlen_k))

        def framed(rows, keys):
            frame = PositionFrame(rows.start, keys.start, seqlen_q, seqlen_k)
            return AttentionOptions(opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap,
                                    opts.dropout_p, frame=frame)

        outs, lses = [], []
        for rows in row_blocks:
            pieces = [(keys, framed(rows, keys)) for keys in key_blocks]
            parts = [ops.attention_forward(q[:, rows], k[:, keys], v[:, keys], slopes, rng_state, *piece.op_arguments(),
                                           None, piece.frame_argument()) for keys, piece in pieces]
            out, lse = flash_attn_combine(torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts]))
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs, dim=1), torch.cat(lses, dim=2)

        def gradients(dout):
            dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in (q, k, v))
            for rows in row_blocks:
                for keys in key_blocks:
                    piece = framed(rows, keys)
                    grads = ops.attention_backward(dout[:, rows], q[:, rows], k[:, keys], v[:, keys], out[:, rows],
                                                   lse[:, :, rows].contiguous(), slopes, rng_state,
                                                   *piece.op_arguments(), None, False, piece.frame_argument())
                    dq[:, rows] += grads[0]
                    dk[:, keys] += grads[1]
                    dv[:, keys] += grads[2]
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

        return out, lse, gradients

    return run


@pytest.mark.parametrize("seqlen,nheads,nheads_k,head_dim,option,dtype", FRAME_CASES,
                         ids=[f"{c[4]}-{str(c[5])[6:]}" for c in FRAME_CASES])
def test_position_frames_split_a_call_exactly(backend, seqlen, nheads, nheads_k, head_dim, option, dtype):
    """Masks, ALiBi and the dropout stream follow the frame: four framed pieces of a call, merged by their
    log-sum-exps, are the call, on the PyTorch path and on the Triton kernels (which must take no Hopper kernel)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = make_case((1, seqlen, seqlen, nheads, nheads_k, head_dim), option, device)
    testing.check_run_against_reference(case, dtype, device, _framed_run(seqlen // 3, 2 * seqlen // 3 + 1))


@pytest.mark.gpu
@pytest.mark.parametrize("option", ["window", "causal-alibi-softcap", "window-dropout-scale", "dropout", "causal"])
def test_position_frames_split_a_call_exactly_at_gpu_sizes(triton_backend, option):
    """The compiled kernels with frames, at sizes where the tiles' interior and boundary loops all run (16-bit: the
    calls that would take the Hopper kernels without a frame)."""
    case = make_case((2, 1531, 1531, 8, 2, 128), option, "cuda")
    testing.check_run_against_reference(case, torch.bfloat16, "cuda", _framed_run(517, 1100))
