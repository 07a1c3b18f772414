"""flash_attn_with_kvcache against the float64 reference over the concatenated cache.

Every test runs on both backends: the torch path, and the Triton kernels (the interpreter without a
GPU, CUDA with one). The ``gpu``-marked tests add decode-sized shapes on the GPU.
"""


from typing import NamedTuple

import pytest
import torch
from kvcache_cases import KVProblem, build, expected, gather_paged, rotary_ref, to_paged, variant

from flashattn import configs, flash_attn_with_kvcache
from flashattn.cpu_decode import rotate
from flashattn.launch import common
from flashattn.launch import decode as launch_decode
from flashattn.testing import assert_lse_close, assert_within_rule, rounding_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def run(inputs: dict, **overrides):
    """Call flash_attn_with_kvcache on copies of the caches; returns (out, lse, k_cache, v_cache) after."""
    arguments = dict(inputs, **overrides)
    arguments["k_cache"], arguments["v_cache"] = arguments["k_cache"].clone(), arguments["v_cache"].clone()
    out, lse = flash_attn_with_kvcache(**arguments, return_softmax_lse=True)
    return out, lse, arguments["k_cache"], arguments["v_cache"]


class Checked(NamedTuple):
    """What ``check`` ran and held to the rule: the call's arguments, its results (out, lse, k_cache, v_cache: the
    caches as called, a paged problem's pools), and the reference in float64 (oracle) and in the inputs' dtype."""

    call_inputs: dict
    results: tuple
    oracle: dict
    baseline: dict


def check(problem: KVProblem, dtype: torch.dtype, device=DEVICE, seed: int = 0) -> Checked:
    """Run ``problem`` (paged if it says so) and hold out, lse and the appended cache to the rule."""
    inputs = build(problem, dtype, device, seed)
    oracle, baseline = expected(inputs, upcast=True), expected(inputs, upcast=False)
    call_inputs = to_paged(inputs, problem.page_size) if problem.page_size else inputs
    results = run(call_inputs)
    out, lse, k_cache, v_cache = results
    if problem.page_size:
        k_cache, v_cache = (gather_paged(c, call_inputs["block_table"]) for c in (k_cache, v_cache))
    assert out.dtype == dtype and out.shape == inputs["q"].shape
    assert_within_rule("out", out, oracle["out"], baseline["out"], factor=2)
    assert_lse_close(lse, oracle["lse"], dtype)
    assert_within_rule("k_cache", k_cache, oracle["k_cache"], baseline["k_cache"], factor=2)
    assert torch.equal(v_cache, baseline["v_cache"]), "v_cache: the append must copy v exactly"
    return Checked(call_inputs, results, oracle, baseline)


BASE = KVProblem()
PAGED = KVProblem(capacity=48, page_size=16, cache_seqlens=(5, 40))

# Interpreter-sized problems: each names what it adds to the plain decode step.
PROBLEMS = {
    "decode": BASE,
    "decode-causal-mqa": variant(BASE, nheads=5, nheads_k=1, options={"causal": True}),
    "decode-no-append": variant(BASE, seqlen_new=0, cache_seqlens=(1, 48)),
    "chunk-causal-gqa": variant(BASE, seqlen_q=6, seqlen_new=6, nheads=6, nheads_k=2, options={"causal": True}),
    "more-queries-than-new": variant(BASE, seqlen_q=5, seqlen_new=2, options={"causal": True}),
    "rotary-interleaved": variant(BASE, head_dim=32, rotary_dim=32, seqlen_new=3, seqlen_q=3,
                                  options={"causal": True}),
    "rotary-neox-partial": variant(BASE, rotary_dim=16, interleaved=False, seqlen_new=2, seqlen_q=2,
                                   options={"causal": True}),
    "rotary-not-causal": variant(BASE, rotary_dim=24, interleaved=False, seqlen_new=2, seqlen_q=3),
    "window-alibi-softcap": variant(BASE, seqlen_q=3, seqlen_new=2, options={
        "window_size": (7, 0), "alibi_slopes": "per-batch-head", "softcap": 3.0}),
    "leftpad": variant(BASE, leftpad=(4, 29), seqlen_q=2, seqlen_new=2, rotary_dim=16,
                       options={"causal": True, "alibi_slopes": "per-head"}),
    "batch-idx": variant(BASE, batch_cache=4, cache_seqlens=(20, 7), options={"softmax_scale": 0.3}),
    "split": variant(BASE, num_splits=3, cache_seqlens=(33, 45), seqlen_new=2),
    "split-window": variant(BASE, num_splits=4, seqlen_q=2, options={"window_size": (20, 3)}),
    "empty-cache": variant(BASE, cache_seqlens=(0, 0), seqlen_new=2, seqlen_q=3, options={"causal": True}),
    "paged": PAGED,
    # pages of 3 key blocks: the page-by-page loop walks several blocks per page, and the 3 splits start
    # inside pages
    "paged-large-pages-split": variant(PAGED, capacity=96, page_size=48, cache_seqlens=(70, 90), num_splits=3),
    "paged-all-options": variant(PAGED, batch_cache=3, leftpad=(2, 17), rotary_dim=16, seqlen_new=3, seqlen_q=2,
                                 num_splits=2, options={"causal": True}),
    "head-dim-96": variant(BASE, head_dim=96, nheads=8, nheads_k=2, rotary_dim=32, seqlen_q=2, seqlen_new=2),
}


# The steps whose append the attention launch also makes (FUSE_APPEND: up to FUSED_APPEND_MAX_TOKENS new tokens a
# sequence, without rotary)
FUSED_APPEND = ["decode", "chunk-causal-gqa", "window-alibi-softcap", "batch-idx", "split", "split-window", "paged",
                "paged-large-pages-split", "empty-cache", "decode-causal-mqa", "more-queries-than-new"]


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_matches_reference(backend, monkeypatch, name):
    """On the Triton kernels, a step of FUSED_APPEND is also run with its append launched first
    (``assert_fused_matches_separate``)."""
    checked = check(PROBLEMS[name], torch.float16)
    if backend == "triton" and name in FUSED_APPEND:
        assert_fused_matches_separate(checked, monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["chunk-causal-gqa", "paged-all-options"])
def test_matches_reference_other_dtypes(backend, name, dtype):
    check(PROBLEMS[name], dtype)


def test_append_writes_exactly_the_new_rows(backend):
    problem = variant(PAGED, seqlen_new=5, cache_seqlens=(0, 43), batch_cache=3)
    inputs = build(problem, torch.float16, DEVICE)
    rows = inputs["cache_batch_idx"].long()
    written = torch.zeros(inputs["k_cache"].shape[:2], dtype=torch.bool, device=DEVICE)
    for b, start in enumerate(problem.cache_seqlens):
        written[rows[b], start : start + problem.seqlen_new] = True
    for call_inputs in (inputs, to_paged(inputs, problem.page_size)):
        _, _, k_cache, v_cache = run(call_inputs)
        if "block_table" in call_inputs:
            k_cache, v_cache = (gather_paged(c, call_inputs["block_table"]) for c in (k_cache, v_cache))
        for b, start in enumerate(problem.cache_seqlens):
            assert torch.equal(k_cache[rows[b], start : start + problem.seqlen_new], inputs["k"][b])
            assert torch.equal(v_cache[rows[b], start : start + problem.seqlen_new], inputs["v"][b])
        assert torch.equal(k_cache[~written], inputs["k_cache"][~written]), "k_cache changed outside the append"
        assert torch.equal(v_cache[~written], inputs["v_cache"][~written]), "v_cache changed outside the append"


def test_paged_blocks_nobody_owns_are_untouched(backend):
    inputs = to_paged(build(variant(PAGED, seqlen_new=8), torch.float16, DEVICE), 16)
    _, _, k_cache, _ = run(inputs)
    owned = torch.zeros(k_cache.shape[0], dtype=torch.bool, device=DEVICE)
    owned[inputs["block_table"].long().view(-1)] = True
    assert torch.equal(k_cache[~owned], inputs["k_cache"][~owned])


def test_paged_matches_contiguous(backend):
    problem = variant(PAGED, seqlen_q=3, seqlen_new=3, rotary_dim=16, options={"causal": True})
    inputs = build(problem, torch.float16, DEVICE)
    contiguous = run(inputs)
    paged = run(to_paged(inputs, problem.page_size))
    assert torch.equal(paged[0], contiguous[0]) and torch.equal(paged[1], contiguous[1])


def test_split_counts_agree(backend):
    problem = variant(BASE, cache_seqlens=(40, 47), seqlen_q=2, options={"causal": True})
    inputs = build(problem, torch.float32, DEVICE)
    oracle, baseline = expected(inputs, upcast=True), expected(inputs, upcast=False)
    results = {}
    for num_splits in (1, 2, 5, 0):
        out, lse, _, _ = run(inputs, num_splits=num_splits)
        assert_within_rule(f"out ({num_splits} splits)", out, oracle["out"], baseline["out"], factor=2)
        assert_lse_close(lse, oracle["lse"], torch.float32)
        results[num_splits] = out
    # splitting changes only the order of float32 sums: a few roundings of the output apart
    for num_splits, out in results.items():
        assert (out - results[1]).abs().max().item() <= 8 * rounding_error(oracle["out"], torch.float32) + 1e-6, \
            f"{num_splits} splits vs 1"


def test_int_cache_seqlens_matches_tensor(backend):
    problem = variant(BASE, cache_seqlens=(17, 17))
    inputs = build(problem, torch.float16, DEVICE)
    as_tensor = run(inputs)
    as_int = run(inputs, cache_seqlens=17)
    assert torch.equal(as_int[0], as_tensor[0]) and torch.equal(as_int[2], as_tensor[2])


def test_rows_that_see_no_key(backend):
    """An empty cache and nothing appended: every row sees no key, giving 0 and lse = +inf."""
    inputs = build(variant(BASE, cache_seqlens=(0, 0), seqlen_new=0, seqlen_q=2), torch.float16, DEVICE)
    out, lse, _, _ = run(inputs)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all() and (lse > 0).all()


def test_returns_out_alone_by_default(backend):
    inputs = build(BASE, torch.float16, DEVICE)
    out = flash_attn_with_kvcache(**inputs)
    assert isinstance(out, torch.Tensor) and out.shape == inputs["q"].shape


@pytest.mark.parametrize("interleaved", [True, False])
def test_cpu_rotary_matches_plain_rotary(interleaved):
    """The torch path's rotation against the rotate-half reference, in float64, rotary_dim < head dim."""
    x = torch.randn(2, 5, 3, 20, dtype=torch.float64)
    angles = torch.rand(30, 6, dtype=torch.float64) * 6
    positions = torch.randint(0, 30, (2, 5))
    ours = rotate(x, angles.cos()[positions].unsqueeze(2), angles.sin()[positions].unsqueeze(2), interleaved)
    torch.testing.assert_close(ours, rotary_ref(x, angles.cos(), angles.sin(), positions, interleaved),
                               rtol=0, atol=1e-14)
    assert torch.equal(ours[..., 12:], x[..., 12:])


def test_rotary_pairs_follow_the_layout():
    """Interleaved turns (0, 1) together; GPT-NeoX turns (0, rotary_dim / 2) together."""
    x = torch.zeros(1, 1, 1, 8, dtype=torch.float64)
    x[..., 0] = 1.0
    cos, sin = torch.zeros(1, 4, dtype=torch.float64), torch.ones(1, 4, dtype=torch.float64)  # 90 degrees
    positions = torch.zeros(1, 1, dtype=torch.long)
    assert rotary_ref(x, cos, sin, positions, True)[..., 1].item() == 1.0
    assert rotary_ref(x, cos, sin, positions, False)[..., 4].item() == 1.0


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors naming the argument; no write outside the cache even unchecked
# ---------------------------------------------------------------------------------------------


def _bad(inputs: dict, match: str, error=ValueError, **overrides):
    with pytest.raises(error, match=match):
        flash_attn_with_kvcache(**dict(inputs, **overrides))


def test_bad_indices_are_refused(backend):
    """check_indices=True: refused before any kernel runs, naming the first bad entry (tests/test_index_safety.py
    holds the default, recorded mode)."""
    inputs = dict(build(BASE, torch.float16, DEVICE), check_indices=True)
    i32 = dict(dtype=torch.int32, device=DEVICE)
    _bad(inputs, "too small for the append", cache_seqlens=torch.tensor([3, 48], **i32))
    _bad(inputs, "too small for the append", cache_seqlens=48)
    _bad(inputs, "cache_seqlens must be >= 0", cache_seqlens=-1)
    _bad(inputs, "too small for the append", cache_seqlens=torch.tensor([-2, 3], **i32))
    _bad(inputs, "cache_batch_idx", cache_batch_idx=torch.tensor([0, 2], **i32))
    _bad(inputs, "cache_leftpad", cache_leftpad=torch.tensor([0, 31], **i32))
    paged = dict(to_paged(build(PAGED, torch.float16, DEVICE), 16), check_indices=True)
    table = paged["block_table"].clone()
    table[1, 0] = paged["k_cache"].shape[0]
    _bad(paged, r"block_table holds a block index outside \[0, 9\)", block_table=table)
    table[1, 0] = -1
    _bad(paged, "block_table holds", block_table=table)
    table = paged["block_table"].clone()
    table[0, 2] = 99  # a page that sequence 0 (5 + 1 keys) never uses: allowed
    flash_attn_with_kvcache(**dict(paged, block_table=table))


def test_bad_shapes_and_dtypes_are_refused(backend):
    inputs = build(BASE, torch.float16, DEVICE)
    i64 = dict(dtype=torch.int64, device=DEVICE)
    _bad(inputs, "cache_seqlens must be int32", TypeError, cache_seqlens=torch.tensor([1, 2], **i64))
    _bad(inputs, "cache_seqlens must be a torch.Tensor", TypeError, cache_seqlens=True)
    _bad(inputs, r"cache_seqlens must have shape \(2\)", cache_seqlens=torch.tensor([1], dtype=torch.int32,
                                                                                     device=DEVICE))
    _bad(inputs, "cache_batch_idx must be int32", TypeError, cache_batch_idx=torch.tensor([0, 1], **i64))
    _bad(inputs, "k_cache must have q's dtype", TypeError, k_cache=inputs["k_cache"].float())
    _bad(inputs, "k must have q's dtype", TypeError, k=inputs["k"].float())
    _bad(inputs, "k and v must be given together", v=None)
    _bad(inputs, "k must have shape", k=inputs["k"][:, :, :1])
    _bad(inputs, "head dim", k_cache=inputs["k_cache"][..., :8], v_cache=inputs["v_cache"][..., :8])
    _bad(inputs, "multiple of the number of key/value heads", q=inputs["q"][:, :, :3])
    _bad(inputs, "contiguous last dimension", k_cache=inputs["k_cache"].transpose(1, 3).contiguous().transpose(1, 3))
    _bad(inputs, "num_splits", num_splits=-1)
    _bad(inputs, "window_size", window_size=(0, -2**63 - 1))
    cos = torch.ones(48, 8, dtype=torch.float16, device=DEVICE)
    _bad(inputs, "rotary_cos and rotary_sin must be given together", rotary_cos=cos)
    _bad(inputs, "need k and v", rotary_cos=cos, rotary_sin=cos, k=None, v=None)
    _bad(inputs, "seqlen_ro >= 48", rotary_cos=cos[:40], rotary_sin=cos[:40])
    _bad(inputs, "rotary_dim <= head dim", rotary_cos=torch.ones(48, 24, device=DEVICE), rotary_sin=cos)
    paged = to_paged(build(PAGED, torch.float16, DEVICE), 16)
    _bad(paged, "block_table must be int32", TypeError, block_table=paged["block_table"].long())
    pool = torch.zeros(4, 24, 2, 40, dtype=torch.float16, device=DEVICE)
    _bad(paged, "page size k_cache.shape.1. must be a multiple of 16", k_cache=pool, v_cache=pool.clone())


def test_forward_only(backend):
    """As in flash-attn there is no backward: asking for one is an error, not a silent zero gradient."""
    inputs = build(BASE, torch.float32, DEVICE)
    inputs["q"].requires_grad_(True)
    out = flash_attn_with_kvcache(**inputs)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out.sum().backward()


# ---------------------------------------------------------------------------------------------
# The GPU: decode-sized shapes (GQA 32/8, head dim 128, long caches), contiguous and paged
# ---------------------------------------------------------------------------------------------

GPU_PROBLEMS = [
    KVProblem(batch=4, nheads=32, nheads_k=8, head_dim=128, capacity=4096, cache_seqlens=(4095, 1000, 17, 3000)),
    KVProblem(batch=2, nheads=32, nheads_k=8, head_dim=128, capacity=8192, cache_seqlens=(8000, 5000),
              page_size=256, rotary_dim=128, interleaved=False, options={"causal": True}),
    KVProblem(batch=3, nheads=16, nheads_k=2, head_dim=64, capacity=2048, cache_seqlens=(100, 2000, 1),
              page_size=16, rotary_dim=32, seqlen_q=4, seqlen_new=4, options={"causal": True}),
    KVProblem(batch=2, seqlen_q=128, seqlen_new=128, nheads=8, nheads_k=2, head_dim=128, capacity=1024,
              cache_seqlens=(500, 0), leftpad=(100, 0), options={"causal": True, "window_size": (300, 0)}),
    KVProblem(batch=2, nheads=8, nheads_k=8, head_dim=256, capacity=1024, cache_seqlens=(1000, 3),
              batch_cache=5, options={"softcap": 30.0, "alibi_slopes": "per-head"}),
    KVProblem(batch=1, nheads=32, nheads_k=8, head_dim=96, capacity=32768, cache_seqlens=(32000,), num_splits=7),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("problem", GPU_PROBLEMS, ids=str)
def test_matches_reference_on_gpu(monkeypatch, problem, dtype):
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    check(problem, dtype, "cuda")
    torch.cuda.synchronize()


# Forms of the Triton decode kernel's paged loop that the rule may or may not take, forced, and held to the rule
# wherever they can run: the block table read a chunk of entries at a time, or page by page
DECODE_FORMS = {"table-chunk": 4, "page-by-page": 0}


def force_decode_loads(monkeypatch, table_chunk: int) -> None:
    """Every step to the Triton kernel (the Hopper one has no such forms), its paged loop in the given form."""
    monkeypatch.setattr(launch_decode, "hopper_decode_fits", lambda *args: False)
    monkeypatch.setattr(configs, "paged_table_chunk", lambda blocks_per_split: table_chunk)


# The forms differ only on a paged cache whose pages hold whole key blocks, without left padding (the launch's
# ONE_PAGE): every other cache, and by the rule every split of fewer than TABLE_CHUNK_MIN_BLOCKS key blocks (each
# problem here), takes the page-by-page form, which test_matches_reference runs on these problems
@pytest.mark.parametrize("name", ["paged", "paged-large-pages-split"])
def test_decode_forms_match_reference(triton_backend, monkeypatch, name):
    """The table read in chunks on the interpreter's shapes."""
    force_decode_loads(monkeypatch, DECODE_FORMS["table-chunk"])
    check(PROBLEMS[name], torch.float16, triton_backend)


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(DECODE_FORMS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("problem", GPU_PROBLEMS, ids=str)
def test_decode_forms_match_reference_on_gpu(monkeypatch, problem, dtype, form):
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    force_decode_loads(monkeypatch, DECODE_FORMS[form])
    check(problem, dtype, "cuda")
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(DECODE_FORMS))
def test_decode_forms_paged_match_contiguous_on_gpu(monkeypatch, form):
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    force_decode_loads(monkeypatch, DECODE_FORMS[form])
    problem = KVProblem(batch=8, nheads=32, nheads_k=8, head_dim=128, capacity=8192,
                        cache_seqlens=(8000, 1, 17, 256, 1023, 3333, 2048, 8191))
    inputs = build(problem, torch.bfloat16, "cuda")
    for num_splits in (1, 0, 5):
        contiguous = run(inputs, num_splits=num_splits)
        paged = run(to_paged(inputs, 256), num_splits=num_splits)
        assert torch.equal(paged[0], contiguous[0]) and torch.equal(paged[1], contiguous[1])


# Batches of about two programs per SM or more run unsplit with the streaming stages (configs.streaming_launch):
# 40 sequences x 8 kv heads = 320 programs, with unequal lengths, contiguous and in 256-key pages (whose splits of 16
# blocks or more read the block table in chunks)
STREAMING_PROBLEM = KVProblem(batch=40, nheads=32, nheads_k=8, head_dim=128, capacity=2048,
                              cache_seqlens=tuple((37 * b * b + 5) % 2047 for b in range(40)))


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 256])
def test_streaming_launch_matches_reference_on_gpu(monkeypatch, page_size):
    """The Triton kernel's unsplit streaming launch (the Hopper kernel, which takes such steps on sm90, pinned off)."""
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    monkeypatch.setattr(launch_decode, "hopper_decode_fits", lambda *args: False)
    decide, taken = configs.streaming_launch, []
    monkeypatch.setattr(configs, "streaming_launch", lambda *args: taken.append(decide(*args)) or taken[-1])
    check(variant(STREAMING_PROBLEM, page_size=page_size), torch.bfloat16, "cuda")
    torch.cuda.synchronize()
    assert taken == [True]


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_paged_matches_contiguous_on_gpu(monkeypatch, page_size):
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    problem = KVProblem(batch=8, nheads=32, nheads_k=8, head_dim=128, capacity=4096,
                        cache_seqlens=(4000, 1, 17, 256, 1023, 3333, 2048, 4095), rotary_dim=64)
    inputs = build(problem, torch.bfloat16, "cuda")
    for num_splits in (1, 0):
        contiguous = run(inputs, num_splits=num_splits)
        paged = run(to_paged(inputs, page_size), num_splits=num_splits)
        assert torch.equal(paged[0], contiguous[0]) and torch.equal(paged[1], contiguous[1])


def test_custom_ops_pass_opcheck(backend):
    """Schema, fake (torch.compile), mutation and dispatch checks of the append-and-attend and attention ops."""
    from flashattn.ops import kvcache_append_attention, kvcache_attention

    if backend == "triton" and DEVICE == "cpu":
        pytest.skip("on a CPU both backends are the op's one CPU registration, which the torch run checks")

    inputs = build(variant(PAGED, rotary_dim=16, batch_cache=3, leftpad=(1, 2)), torch.float16, DEVICE)
    paged = to_paged(inputs, 16)
    for cache in (inputs, paged):
        table = cache.get("block_table")
        torch.library.opcheck(kvcache_append_attention, (
            cache["q"], cache["k_cache"], cache["v_cache"], cache["k"], cache["v"], cache["cache_seqlens"],
            cache["cache_batch_idx"], cache["cache_leftpad"], table, cache["rotary_cos"], cache["rotary_sin"], None,
            0.2, -1, 0, 0.0, True, 2, True))
        torch.library.opcheck(kvcache_attention, (
            cache["q"], cache["k_cache"], cache["v_cache"], cache["cache_seqlens"], cache["cache_batch_idx"],
            cache["cache_leftpad"], table, cache["rotary_cos"], cache["rotary_sin"], None, 1, 0.2, -1, 0, 0.0,
            False, 2, True))


def test_decode_step_compiles_fullgraph(torch_backend):
    """A decode step (append in place, then attend) and a combine compile without graph breaks and give
    eager's results: the ops' fake implementations and mutation annotations are what make this work."""
    from flashattn import flash_attn_combine

    torch._dynamo.reset()
    problem = variant(PAGED, rotary_dim=16, options={"causal": True})
    inputs = build(problem, torch.float32, "cpu")
    paged = to_paged(inputs, 16)

    def step(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens, block_table):
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens,
                                           block_table=block_table, causal=True, return_softmax_lse=True,
                                           check_indices=False)
        merged, _ = flash_attn_combine(torch.stack([out, out]), torch.stack([lse, lse]))
        return merged

    arguments = [paged[name] for name in ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin",
                                          "cache_seqlens", "block_table")]
    eager_arguments = [x.clone() for x in arguments]
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = compiled(*arguments)
    expected_out = step(*eager_arguments)
    torch.testing.assert_close(out, expected_out, rtol=1e-6, atol=1e-6)
    assert torch.equal(arguments[1], eager_arguments[1]), "the compiled step must append into the cache in place"


def test_deferred_index_check_under_compile_reports_on_request(torch_backend):
    """check_indices="deferred" inside a compiled step: no graph break, a bad index recorded, and reported by
    raise_recorded_faults() (the CPU's eager call raises at once: a compiled graph cannot read the buffer)."""
    from flashattn import raise_recorded_faults

    torch._dynamo.reset()
    q, k, v = torch.randn(2, 1, 4, 16), torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    k_cache, v_cache = torch.zeros(2, 32, 2, 16), torch.zeros(2, 32, 2, 16)

    def step(cache_seqlens):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, causal=True)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(torch.tensor([40, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_seqlens out of range at batch element 0"):
        raise_recorded_faults()
    seqlens = torch.tensor([4, 3], dtype=torch.int32)
    torch.testing.assert_close(compiled(seqlens), step(seqlens), rtol=0, atol=0)
    raise_recorded_faults()  # nothing recorded


def test_chained_launch_only_on_hopper_gpus():
    assert not launch_decode.chained_launch(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_chained_launch_changes_nothing_on_gpu(monkeypatch, paged):
    """Split attention and merge chained by programmatic dependent launch (sm90+), after the rotary
    step's own append, against the same kernels launched one after another: bit for bit, eagerly and
    replayed from a CUDA graph, where a kernel that read before its predecessor's writes landed would
    differ."""
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    problem = KVProblem(batch=2, nheads=32, nheads_k=8, head_dim=128, capacity=8192, cache_seqlens=(8000, 3000),
                        seqlen_new=1, rotary_dim=64)
    inputs = build(problem, torch.bfloat16, "cuda")
    call_inputs = to_paged(inputs, 256) if paged else inputs

    def graph_step():
        arguments = dict(call_inputs)
        arguments["k_cache"], arguments["v_cache"] = arguments["k_cache"].clone(), arguments["v_cache"].clone()
        # compile outside the capture; inside it, no host-side index check (it would synchronize)
        flash_attn_with_kvcache(**arguments, return_softmax_lse=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse = flash_attn_with_kvcache(**arguments, return_softmax_lse=True, check_indices=False)
        arguments["k_cache"].copy_(call_inputs["k_cache"])
        arguments["v_cache"].copy_(call_inputs["v_cache"])
        graph.replay()
        torch.cuda.synchronize()
        return out, lse, arguments["k_cache"], arguments["v_cache"]

    results = {}
    for chained in (False, True):
        chain = launch_decode.chained_launch if chained else (lambda device: False)
        monkeypatch.setattr(launch_decode, "chained_launch", chain)
        results[chained] = [run(call_inputs), graph_step()]
    for eager_or_graph in range(2):
        for name, a, b in zip(("out", "lse", "k_cache", "v_cache"), results[False][eager_or_graph],
                              results[True][eager_or_graph], strict=True):
            assert torch.equal(a, b), name


def assert_fused_matches_separate(checked: Checked, monkeypatch) -> None:
    """``check``'s run of a step whose attention launch also appends (up to FUSED_APPEND_MAX_TOKENS new tokens)
    against an append launch followed by the attention: the same caches bit for bit, and that output within the rule
    too (the fused launch puts the new keys' block on the masked path, so the two may round differently)."""
    fused = checked.results
    monkeypatch.setattr(configs, "FUSED_APPEND_MAX_TOKENS", 0)
    out, lse, k_cache, v_cache = run(checked.call_inputs)
    assert torch.equal(fused[2], k_cache) and torch.equal(fused[3], v_cache), "the appended caches differ"
    assert_within_rule("out", out, checked.oracle["out"], checked.baseline["out"], factor=2)
    assert_lse_close(lse, checked.oracle["lse"], out.dtype)


# New keys that end exactly on a key block (64 on the GPU): without the masked path forced onto their
# block, an interior load would read the cache rows the same launch is writing (a race, which the
# interpreter's one-program-at-a-time order would hide)
FUSED_GPU_PROBLEMS = [
    KVProblem(batch=3, nheads=32, nheads_k=8, head_dim=128, capacity=4096, cache_seqlens=(4031, 127, 2047),
              options={"causal": True}),
    KVProblem(batch=2, seqlen_q=4, seqlen_new=4, nheads=16, nheads_k=4, head_dim=128, capacity=8192,
              cache_seqlens=(8188, 60), page_size=256, num_splits=5),
]


@pytest.mark.gpu
@pytest.mark.parametrize("problem", FUSED_GPU_PROBLEMS, ids=str)
def test_fused_append_on_block_boundaries_on_gpu(monkeypatch, problem):
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    assert_fused_matches_separate(check(problem, torch.bfloat16, "cuda"), monkeypatch)
    torch.cuda.synchronize()


@pytest.mark.parametrize(("batch", "expected"),
                         [(1, 33), (2, 16), (4, 8), (8, 4), (16, 2), (17, 3), (64, 3), (66, 3), (67, 1)])
def test_split_count_follows_the_h200_sweep(batch, expected):
    """The automatic split count on an H200 (132 SMs), GQA 32/8, 64k keys (see choose_num_splits):
    below one program per SM two programs per SM, rounded down; 3 splits up to 4 programs per SM. In
    benchmarks/decode_splits.py's sweep these won or came within 3.3% of the winner."""
    assert configs.choose_num_splits(batch * 8, 65536 // 64, 132) == expected


@pytest.mark.parametrize(("batch", "expected"), [(1, 33), (16, 2), (17, 3), (31, 3), (32, 1), (64, 1)])
def test_streaming_tiles_run_unsplit_from_two_programs_per_sm(batch, expected):
    """Tiles with streaming stages (bf16, hdim 128) are not split from 1.9 programs per SM on (batch 32 of
    GQA 32/8 on 132 SMs: 256 programs), and the launch then takes those stages."""
    config = configs.decode_config(4, 128, torch.bfloat16, False)
    assert config.streaming_stages == 4 and config.num_stages == 3
    assert configs.choose_num_splits(batch * 8, 65536 // 64, 132, streaming=True) == expected
    assert configs.streaming_launch(config, batch * 8, 132) == (expected == 1)
    assert configs.decode_config(4, 128, torch.float32, False).streaming_stages == 0
    assert configs.decode_config(4, 256, torch.bfloat16, False).streaming_stages == 0


def test_paged_programs_read_the_block_table_in_chunks_from_32_blocks():
    """Splits of 32 key blocks or more loop over 16 pages at a time; shorter ones page by page."""
    assert configs.paged_table_chunk(31) == 0 and configs.paged_table_chunk(32) == 16


@pytest.mark.parametrize(("batch", "tile", "splits"), [(1, (64, 4), 16), (4, (64, 4), 4), (5, (128, 3), 3),
                                                       (16, (128, 3), 1), (64, (128, 3), 1)])
def test_hopper_decode_tiles_and_splits(batch, tile, splits):
    """The Hopper decode launch on an H200 (132 SMs), GQA 32/8, 8k keys: swapped products on 64-key blocks and 4
    stages; padded rows on 64 x 4 up to a quarter program per SM, 128 x 3 above; splits fill the SMs once (one program
    each), 256 keys a split at least."""
    assert configs.hopper_decode_tile(batch * 8, 132, swapped=True) == (64, 4)
    assert configs.hopper_decode_tile(batch * 8, 132) == tile
    assert configs.hopper_decode_splits(batch * 8, 8192, 132) == splits
    assert configs.hopper_decode_splits(8, 1024, 132) == 4  # 256 keys a split


@pytest.mark.parametrize(("batch", "capacity", "splits"), [(16, 65536, 1), (32, 16384, 1), (32, 65536, 2),
                                                           (64, 131072, 2), (64, 32768, 1)])
def test_hopper_decode_splits_long_caches_past_one_wave(batch, capacity, splits):
    """Past one wave of programs (132 SMs, GQA 32/8), caches of 64k keys or more take two splits; one wave, or
    shorter caches, none."""
    assert configs.hopper_decode_splits(batch * 8, capacity, 132) == splits


@pytest.mark.parametrize(("batch", "peak", "splits"), [(8, 3.35e12, 1), (8, 4.8e12, 2), (4, 3.35e12, 4),
                                                     (7, 3.35e12, 1), (6, 3.35e12, 2), (8, None, 2)])
def test_hopper_decode_splits_only_programs_short_of_the_peak_bandwidth(batch, peak, splits):
    """Below one wave (132 SMs, GQA 32/8, 8k keys) a launch splits only where its unsplit programs, at
    HOPPER_DECODE_PROGRAM_BYTES_PER_S each (60 GB/s), fall short of the GPU's peak memory bandwidth: on an H100
    (3.35 TB/s) from 56 programs (batch 7) on, not on an H200 (4.8 TB/s) below 80; unknown bandwidth splits."""
    assert configs.hopper_decode_splits(batch * 8, 8192, 132, peak) == splits


def test_peak_memory_bandwidth_from_the_memory_clock_and_bus(monkeypatch):
    """2 x memory clock x bus width: an H100 SXM's 2619 MHz over 5120 bits is 3.35 TB/s; no figures, None."""
    class Properties:
        memory_clock_rate, memory_bus_width = 2_619_000, 5120  # kHz, bits

    common._peak_memory_bandwidth.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Properties())
    try:
        assert common._peak_memory_bandwidth(0) == pytest.approx(3.352e12, rel=1e-3)
        Properties.memory_clock_rate = 0
        common._peak_memory_bandwidth.cache_clear()
        assert common._peak_memory_bandwidth(0) is None
    finally:
        common._peak_memory_bandwidth.cache_clear()
    assert common.peak_memory_bandwidth(torch.device("cpu")) is None


def test_hopper_decode_reads_the_length_in_its_partitions_up_to_5_splits():
    """EARLY_FIRST_BLOCK by the split count (HOPPER_DECODE_EARLY_MAX_SPLITS)."""
    assert [configs.hopper_decode_early_first_block(n) for n in (1, 2, 5, 6, 8, 16)] == [True] * 3 + [False] * 3


def test_hopper_decode_consumers_keep_their_own_stages():
    """Two swapped consumers only on a ring of an even stage count (5 stages with two faulted); padded rows, one."""
    assert [configs.hopper_decode_consumers(8, stages) for stages in (2, 3, 4, 5, 6)] == [2, 1, 2, 1, 2]
    assert configs.hopper_decode_consumers(0, 4) == 1


def test_hopper_decode_swaps_the_products_of_groups_up_to_16():
    """wgmma's N for a swapped program: the group's query rows padded to a power of two, 8 at least; groups past
    HOPPER_DECODE_SWAPPED_MAX_GROUP pad their rows to 64 instead (0)."""
    assert [configs.hopper_decode_query_rows(g) for g in (1, 4, 8, 9, 16, 17, 32)] == [8, 8, 8, 16, 16, 0, 0]


# the Hopper decode kernel (sm90): one query token, contiguous and paged caches
HOPPER_PROBLEMS = [
    KVProblem(batch=2, nheads=32, nheads_k=8, head_dim=128, capacity=8192, cache_seqlens=(8191, 4000)),
    KVProblem(batch=4, nheads=16, nheads_k=4, head_dim=64, capacity=1000, cache_seqlens=(0, 63, 64, 983),
              seqlen_new=16, options={"causal": True}),
    KVProblem(batch=1, nheads=32, nheads_k=8, head_dim=128, capacity=3000, cache_seqlens=(2000,), seqlen_new=3,
              num_splits=5),
    KVProblem(batch=1, nheads=32, nheads_k=8, head_dim=128, capacity=8192, cache_seqlens=(8192,), seqlen_new=0),
    KVProblem(batch=3, nheads=32, nheads_k=8, head_dim=128, capacity=4200, cache_seqlens=(4097, 1, 1000),
              seqlen_new=0),
    KVProblem(batch=16, nheads=32, nheads_k=8, head_dim=128, capacity=1100, cache_seqlens=(1023,) * 15 + (0,),
              seqlen_new=0, options={"causal": True}),
    KVProblem(batch=2, nheads=8, nheads_k=1, head_dim=64, capacity=3000, cache_seqlens=(2999, 65), seqlen_new=0,
              num_splits=7),
    KVProblem(batch=2, nheads=16, nheads_k=16, head_dim=128, capacity=700, cache_seqlens=(700, 64), seqlen_new=0,
              num_splits=1),
    KVProblem(batch=2, nheads=32, nheads_k=8, head_dim=128, capacity=4096, page_size=256, cache_seqlens=(4095, 1000)),
    KVProblem(batch=3, nheads=16, nheads_k=4, head_dim=64, capacity=1024, page_size=64, cache_seqlens=(1000, 0, 500),
              seqlen_new=5, num_splits=3),
    KVProblem(batch=16, nheads=32, nheads_k=8, head_dim=128, capacity=2048, page_size=128,
              cache_seqlens=(2047,) * 15 + (100,)),
    KVProblem(batch=2, nheads=32, nheads_k=2, head_dim=128, capacity=2048, cache_seqlens=(2000, 77), seqlen_new=2),
    KVProblem(batch=2, nheads=32, nheads_k=1, head_dim=64, capacity=1500, cache_seqlens=(1499, 300), seqlen_new=1,
              num_splits=3),
]


@pytest.mark.gpu
@pytest.mark.parametrize("early", [None, True], ids=["early-by-rule", "early-always"])
@pytest.mark.parametrize("form", ["swapped", "swapped-1", "padded"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("problem", HOPPER_PROBLEMS, ids=str)
def test_hopper_decode_matches_reference_on_gpu(monkeypatch, problem, dtype, form, early):
    """The Hopper decode kernel against the float64 reference, and its append (1, 2, 3, 5 and 16 new keys, into an empty
    cache too): split (automatic, 3, 5, 7) and unsplit, lengths that do not fill a key block, an empty sequence (out 0,
    lse +inf), GQA groups of 1, 4, 8, 16 and 32, each consumer (swapped products for groups of up to 16, by one or two
    warpgroups; padded rows, on both of their tiles, 64 and 128 keys), contiguous (whole blocks read from each split's
    own offset on) and paged (pages of 64, 128 and 256 keys); the partitions reading the sequence's length (split 0's
    first block copied before it arrives) by the rule (launches of up to 5 splits) or in every launch."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper decode kernel is sm90's")
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    if form == "padded":
        monkeypatch.setattr(configs, "hopper_decode_query_rows", lambda group_size: 0)
    monkeypatch.setattr(configs, "HOPPER_DECODE_CONSUMERS", 1 if form == "swapped-1" else 2)
    if early:
        monkeypatch.setattr(configs, "hopper_decode_early_first_block", lambda num_splits: True)
    # the kernel, not the rule of when the table takes it (which depends on the GPU's SM count)
    monkeypatch.setattr(configs, "HOPPER_DECODE_MAX_PROGRAMS_PER_PROCESSOR", float("inf"))
    monkeypatch.setattr(configs, "HOPPER_DECODE_MAX_BYTES_PER_PROCESSOR", float("inf"))
    taken = []
    hopper_attention = launch_decode._hopper_attention
    monkeypatch.setattr(launch_decode, "_hopper_attention", lambda *args: taken.append(1) or hopper_attention(*args))
    check(problem, dtype, "cuda")
    torch.cuda.synchronize()
    assert taken, "the step did not take the Hopper kernel"


# The Hopper decode kernel (one query token, head dims 64 and 128) copies a sequence's last key block whole, rows past
# the length included; its loader zeroes their values before the consumer's O^T product reads them.
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("head_dim, queries, nheads", [
    (64, 1, 8), (128, 1, 8), (128, 1, 128), (256, 1, 8), (64, 4, 8), (128, 4, 8), (256, 4, 8),
])
def test_cache_rows_past_the_lengths_are_never_read(head_dim, queries, nheads):
    """A cache allocated empty holds anything past cache_seqlens, NaN included: the step's output is what it is with
    those rows finite. GQA groups of 2 (swapped products) and 32 (padded rows), split or not (one split: block 0 is
    copied before the length is known); length 1 leaves a block of one key."""
    lengths = torch.tensor([300, 517, 1], device="cuda", dtype=torch.int32)
    k_cache, v_cache = (torch.randn(3, 1024, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(3, queries, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
    poisoned_k, poisoned_v = k_cache.clone(), v_cache.clone()
    for b, length in enumerate(lengths.tolist()):
        poisoned_k[b, length:], poisoned_v[b, length:] = float("inf"), float("nan")
    for num_splits in (0, 1):
        clean = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True, num_splits=num_splits)
        poisoned = flash_attn_with_kvcache(q, poisoned_k, poisoned_v, cache_seqlens=lengths, causal=True,
                                           num_splits=num_splits)
        assert torch.isfinite(poisoned).all(), f"num_splits {num_splits}"
        torch.testing.assert_close(poisoned, clean, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_next_sequences_new_keys_are_never_read(head_dim):
    """The step's new keys of one sequence (a block of their own, shorter than a key block) stay out of the others'
    attention: NaN new keys and values in sequence 1 leave sequences 0 and 2 as they are with finite ones."""
    lengths = torch.tensor([300, 517, 40], device="cuda", dtype=torch.int32)
    k_cache, v_cache = (torch.randn(3, 1024, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(3, 1, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(3, 1, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    poisoned_k, poisoned_v = k_new.clone(), v_new.clone()
    poisoned_k[1], poisoned_v[1] = float("inf"), float("nan")
    clean = flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k_new, v_new, cache_seqlens=lengths,
                                    causal=True)
    poisoned = flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), poisoned_k, poisoned_v,
                                       cache_seqlens=lengths, causal=True)
    for b in (0, 2):
        assert torch.isfinite(poisoned[b]).all(), f"sequence {b}"
        torch.testing.assert_close(poisoned[b], clean[b], atol=0, rtol=0)

