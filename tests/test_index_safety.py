"""No index, checked or not, reaches outside the tensors a call was given.

Every tensor of a call lives inside a guard region: a larger allocation filled with a sentinel (NaN for the float
tensors, a huge value for the index tensors), the call given a view into its middle. After a call with bad indices the
guards still hold their sentinels (nothing was written outside) and no sentinel reached the output. The tests run on
the torch path and on the Triton kernels (the interpreter on the CPU, CUDA on the GPU); on the GPU
``benchmarks/sanitizer.sh`` runs them under compute-sanitizer's memcheck, which also sees reads.

A bad index is reported according to ``check_indices``: ``"deferred"`` (the default) records it on the device and
``raise_recorded_faults`` names it, ``True`` refuses it before any kernel runs, ``False`` clamps silently.
"""

import pytest
import torch
from kvcache_cases import KVProblem, build, to_paged, variant

from flashattn import flash_attn_varlen_func, flash_attn_with_kvcache, raise_recorded_faults

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GUARD = 257  # elements each side of a tensor: more than a row of the caches
BIG = 2**30

CACHE = KVProblem(capacity=48, cache_seqlens=(13, 30))
PAGED = KVProblem(capacity=48, page_size=16, cache_seqlens=(5, 30))


def guarded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(region, view): ``x`` copied into the middle of a larger allocation filled with the sentinel."""
    sentinel = float("nan") if x.is_floating_point() else BIG
    region = torch.full((x.numel() + 2 * GUARD,), sentinel, dtype=x.dtype, device=x.device)
    view = region[GUARD : GUARD + x.numel()].view(x.shape)
    view.copy_(x)
    return region, view


def guard_all(inputs: dict) -> dict:
    """Every tensor of ``inputs`` replaced by a view into its own guard region; the regions under ``"_regions"``."""
    regions = {}
    for name, x in list(inputs.items()):
        if isinstance(x, torch.Tensor):
            regions[name], inputs[name] = guarded(x)
    inputs["_regions"] = regions
    return inputs


def assert_guards_hold(inputs: dict) -> None:
    for name, region in inputs["_regions"].items():
        for side in (region[:GUARD], region[-GUARD:]):
            held = side.isnan().all() if side.is_floating_point() else (side == BIG).all()
            assert held, f"a write left {name}: its guard region changed"


def call(inputs: dict, **options):
    arguments = {name: x for name, x in inputs.items() if name != "_regions"}
    return flash_attn_with_kvcache(**arguments, **options)


def deferred_call(inputs: dict):
    """The default mode: the call, then the report (raised by the call itself on the CPU, by raise_recorded_faults
    on the GPU, where the call never waits). Returns the ValueError's message and the output."""
    out = None
    with pytest.raises(ValueError, match="out of range") as raised:
        out = call(inputs)
        torch.cuda.synchronize() if DEVICE == "cuda" else None
        raise_recorded_faults()
    return str(raised.value), out


BAD_CASES = {
    # name: (problem, paged, overrides, the argument the report names)
    "seqlens-negative": (CACHE, False, dict(cache_seqlens=(-100, 5)), "cache_seqlens"),
    "seqlens-most-negative": (CACHE, False, dict(cache_seqlens=(-BIG, 5)), "cache_seqlens"),
    "seqlens-past-capacity": (CACHE, False, dict(cache_seqlens=(BIG, 47)), "cache_seqlens"),
    "batch-idx": (variant(CACHE, batch_cache=3), False, dict(cache_batch_idx=(-1, BIG)), "cache_batch_idx"),
    "leftpad": (CACHE, False, dict(cache_leftpad=(-5, BIG)), "cache_leftpad"),
    "block-table": (PAGED, True, dict(block_table={(0, 0): -1, (1, 1): BIG}), "block_table"),
    "paged-seqlens": (PAGED, True, dict(cache_seqlens=(-7, BIG)), "cache_seqlens"),
}


def bad_inputs(case: str, seqlen_new: int, rotary: bool = False) -> tuple[dict, str]:
    problem, paged, overrides, argument = BAD_CASES[case]
    problem = variant(problem, seqlen_new=seqlen_new, seqlen_q=max(seqlen_new, 1),
                      rotary_dim=16 if rotary else 0, options={"causal": True} if seqlen_new > 1 else {})
    inputs = build(problem, torch.float16, DEVICE)
    if paged:
        inputs = to_paged(inputs, problem.page_size)
    for name, value in overrides.items():
        if name == "block_table":
            for where, entry in value.items():
                inputs["block_table"][where] = entry
        else:
            inputs[name] = torch.tensor(value, dtype=torch.int32, device=DEVICE)
    return guard_all(inputs), argument


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_a_bad_index_is_recorded_and_never_leaves_the_tensors(backend, case):
    """The default mode, with the append inside the attention's launch."""
    inputs, argument = bad_inputs(case, seqlen_new=2)
    message, _ = deferred_call(inputs)
    assert argument in message
    assert_guards_hold(inputs)
    raise_recorded_faults()  # reported once: the buffer is clear again


@pytest.mark.parametrize("case", ["seqlens-negative", "batch-idx", "block-table"])
@pytest.mark.parametrize("step", ["no-append", "long-chunk-rotary"])
def test_other_steps_stay_inside_the_tensors(backend, case, step):
    """Without an append, and with one in a launch of its own (a chunk longer than the fused append takes, rotated)."""
    # 17: more new keys than the attention's launch appends (16), and room for them after 30 cached ones
    seqlen_new, rotary = (0, False) if step == "no-append" else (17, True)
    inputs, argument = bad_inputs(case, seqlen_new, rotary)
    message, _ = deferred_call(inputs)
    assert argument in message
    assert_guards_hold(inputs)


@pytest.mark.parametrize("case", ["seqlens-negative", "seqlens-most-negative", "batch-idx", "leftpad"])
def test_unchecked_indices_are_clamped_silently(backend, case):
    """check_indices=False: nothing raised or recorded, nothing written outside, and an element with a bad index
    appends nothing (no valid cache entry is overwritten)."""
    inputs, _ = bad_inputs(case, seqlen_new=2)
    untouched = slice(None) if case in ("batch-idx", "leftpad") else 0  # the cache rows no valid element appends to
    before = inputs["k_cache"][untouched].clone(), inputs["v_cache"][untouched].clone()
    out = call(inputs, check_indices=False)
    raise_recorded_faults()  # nothing recorded
    assert_guards_hold(inputs)
    assert out.isfinite().all(), "a sentinel reached the output"
    assert torch.equal(inputs["k_cache"][untouched], before[0]), "an element with a bad index must append nothing"
    assert torch.equal(inputs["v_cache"][untouched], before[1]), "an element with a bad index must append nothing"


def test_strict_mode_refuses_before_any_write(backend):
    inputs, _ = bad_inputs("seqlens-past-capacity", seqlen_new=2)
    caches = inputs["k_cache"].clone(), inputs["v_cache"].clone()
    with pytest.raises(ValueError, match="too small for the append"):
        call(inputs, check_indices=True)
    assert torch.equal(inputs["k_cache"], caches[0]) and torch.equal(inputs["v_cache"], caches[1])
    with pytest.raises(ValueError, match="check_indices must be"):
        call(inputs, check_indices="sometimes")


def test_a_clean_step_reports_nothing(backend):
    inputs = guard_all(build(variant(CACHE, seqlen_new=2), torch.float16, DEVICE))
    out = call(inputs)
    raise_recorded_faults()
    assert_guards_hold(inputs)
    assert out.isfinite().all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_trusted_cu_seqlens_are_clamped_on_the_gpu():
    """On the GPU with int max lengths cu_seqlens are not read on the host (as in flash-attn); kernels clamp them."""
    total, nheads, head_dim = 96, 4, 64
    q, k, v = (torch.randn(total, nheads, head_dim, dtype=torch.float16, device="cuda") for _ in range(3))
    regions = {}
    inputs = dict(q=q, k=k, v=v, cu_seqlens_q=torch.tensor([0, 40, -BIG, BIG], dtype=torch.int32, device="cuda"),
                  cu_seqlens_k=torch.tensor([-5, 50, 20, BIG], dtype=torch.int32, device="cuda"))
    for name in list(inputs):
        regions[name], inputs[name] = guarded(inputs[name])
    for x in (inputs["q"], inputs["k"], inputs["v"]):
        x.requires_grad_(True)
    out = flash_attn_varlen_func(**inputs, max_seqlen_q=total, max_seqlen_k=total, causal=True)
    out.float().sum().backward()
    torch.cuda.synchronize()
    assert_guards_hold({"_regions": regions})
    assert out.isfinite().all(), "a sentinel reached the output"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("page_size", [None, 64], ids=["contiguous", "paged"])
def test_a_default_step_is_captured_in_a_cuda_graph(page_size):
    """The default step never waits for the host: it is captured in a CUDA graph, and replays of the graph follow new
    lengths and new keys written into the captured tensors, matching eager steps; a bad length put there is recorded
    by the replay and reported by raise_recorded_faults, with nothing written outside the caches."""
    problem = KVProblem(batch=3, nheads=8, nheads_k=2, head_dim=128, capacity=256, cache_seqlens=(17, 100, 200),
                        page_size=page_size)

    def guarded_inputs() -> dict:  # the same values and alignments (which pick the kernel) each time
        inputs = build(problem, torch.bfloat16, "cuda")
        return guard_all(to_paged(inputs, page_size) if page_size else inputs)

    inputs = guarded_inputs()
    static = {name: x for name, x in inputs.items() if name != "_regions"}
    eager = {name: x for name, x in guarded_inputs().items() if name != "_regions"}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture: compile, plans, the fault buffer
        flash_attn_with_kvcache(**{**static, "k_cache": static["k_cache"].clone(),
                                   "v_cache": static["v_cache"].clone()})
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_with_kvcache(**static)
    for lengths in ((18, 101, 201), (0, 7, 254)):
        new_k, new_v = torch.randn_like(static["k"]), torch.randn_like(static["v"])
        for target in (static, eager):
            target["cache_seqlens"].copy_(torch.tensor(lengths, dtype=torch.int32))
            target["k"].copy_(new_k)
            target["v"].copy_(new_v)
        graph.replay()
        expected = flash_attn_with_kvcache(**eager)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        torch.testing.assert_close(static["k_cache"], eager["k_cache"], rtol=0, atol=0)
    raise_recorded_faults()
    static["cache_seqlens"].copy_(torch.tensor([-3, 5, 10_000], dtype=torch.int32))
    graph.replay()
    with pytest.raises(ValueError, match="cache_seqlens out of range"):
        raise_recorded_faults()
    assert_guards_hold(inputs)
