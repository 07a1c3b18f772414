"""flashattn as a transformers attention implementation: tiny random Llama, Qwen2 and Mistral models.

Logits, one training step's gradients and generate() with a KV cache against transformers' own "eager"
and "sdpa" implementations. The oracle is "sdpa" in float64 ("eager" in float64 turns left-padded rows
into NaN: its -finfo.max mask overflows); the baselines that set the tolerance are "eager" and "sdpa"
in the test's dtype. Models come from configs: nothing is downloaded.
"""

import importlib

import pytest
import torch

from flashattn.testing import assert_within_rule

# transformers, and flashattn's integration (whose import registers ATTN_IMPLEMENTATION with it), are imported by the
# fixture below when a test here runs: at collection they would cost every pytest-xdist worker seconds
transformers = None
ATTN_IMPLEMENTATION = None


@pytest.fixture(autouse=True)
def _imported():
    global transformers, ATTN_IMPLEMENTATION
    transformers = pytest.importorskip("transformers")
    ATTN_IMPLEMENTATION = importlib.import_module("flashattn.integrations.transformers").ATTN_IMPLEMENTATION


VOCAB = 101
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)


# each model's config, built when a test runs (transformers is imported then)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON),
    # sliding windows shorter than the sequences, so that the window matters
    "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=7),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=9, max_window_layers=1),
}
MODELS = list(CONFIGS)


def build(name: str, implementation: str, dtype=torch.float32, state=None, device="cpu"):
    config = CONFIGS[name]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


def padded_batch(side: str):
    """Token ids and attention mask of three sequences of lengths 19, 12 and 5, padded on one side
    (or all of length 19 for ``side="none"``: transformers then passes no mask, only is_causal)."""
    torch.manual_seed(1)
    lengths, width = ((19, 19, 19) if side == "none" else (19, 12, 5)), 19
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        span = slice(0, n) if side == "right" else slice(width - n, width)
        ids[row, span] = torch.randint(1, VOCAB, (n,))
        mask[row, span] = 1
    return ids, mask


def check_logits(name: str, dtype: torch.dtype, side: str, device: str = "cpu") -> None:
    """Our logits at the real tokens within the rule of both "eager" and "sdpa" (oracle: float64 sdpa)."""
    state = build(name, "eager").state_dict()
    ours = build(name, ATTN_IMPLEMENTATION, dtype, state, device)
    assert ours.config._attn_implementation == ATTN_IMPLEMENTATION
    ids, mask = (x.to(device) for x in padded_batch(side))
    real = mask.bool()
    with torch.no_grad():
        logits = ours(input_ids=ids, attention_mask=mask).logits
        oracle = build(name, "sdpa", torch.float64, state, device)(input_ids=ids, attention_mask=mask).logits
        for baseline_name in ("eager", "sdpa"):
            baseline = build(name, baseline_name, dtype, state, device)(input_ids=ids, attention_mask=mask).logits
            assert_within_rule(f"logits vs {baseline_name}", logits[real], oracle[real], baseline[real], factor=2)


@pytest.mark.parametrize("side", ["right", "left", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_eager_and_sdpa(torch_backend, name, dtype, side):
    check_logits(name, dtype, side)


@pytest.mark.interpreter
def test_logits_on_the_kernels(triton_backend):
    check_logits("mistral", torch.float32, "left", triton_backend)


@pytest.mark.gpu
@pytest.mark.parametrize("side", ["right", "left", "none"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", MODELS)
def test_logits_on_the_gpu(triton_backend, name, dtype, side):
    check_logits(name, dtype, side, "cuda")


@pytest.mark.parametrize("name", MODELS)
def test_training_step_gradients_match_eager(torch_backend, name):
    reference = build(name, "eager")
    state = reference.state_dict()
    ids, mask = padded_batch("right")
    labels = ids.masked_fill(mask == 0, -100)

    def grads(model):
        model.train()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}

    ours = grads(build(name, ATTN_IMPLEMENTATION, state=state))
    oracle = grads(build(name, "sdpa", torch.float64, state))
    baseline = grads(build(name, "eager", torch.float32, state))
    for param in ours:
        assert_within_rule(param, ours[param], oracle[param], baseline[param], factor=3)


@pytest.mark.parametrize("name", MODELS)
def test_prefill_in_two_chunks_with_a_cache_matches_one_pass(torch_backend, name):
    """The second chunk's queries sit after the cached keys: the mask and the kernels' bottom-right
    causal window must agree on what they see."""
    ids, mask = padded_batch("left")
    state = build(name, "eager").state_dict()
    model = build(name, ATTN_IMPLEMENTATION, state=state)
    with torch.no_grad():
        first = model(input_ids=ids[:, :11], attention_mask=mask[:, :11], use_cache=True)
        second = model(input_ids=ids[:, 11:], attention_mask=mask, past_key_values=first.past_key_values).logits
        oracle = build(name, "sdpa", torch.float64, state)(input_ids=ids, attention_mask=mask).logits[:, 11:]
        baseline = build(name, "sdpa", state=state)(input_ids=ids, attention_mask=mask).logits[:, 11:]
    real = mask[:, 11:].bool()
    assert_within_rule("second chunk", second[real], oracle[real], baseline[real], factor=2)


def check_generate(name: str, device: str = "cpu") -> None:
    ids, mask = (x.to(device) for x in padded_batch("left"))
    state = build(name, "eager").state_dict()
    tokens = {}
    for implementation in (ATTN_IMPLEMENTATION, "sdpa", "eager"):
        model = build(name, implementation, state=state, device=device)
        tokens[implementation] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12,
                                                do_sample=False, use_cache=True, pad_token_id=0)
    assert tokens[ATTN_IMPLEMENTATION].shape == (3, 19 + 12)
    assert torch.equal(tokens[ATTN_IMPLEMENTATION], tokens["sdpa"])
    assert torch.equal(tokens[ATTN_IMPLEMENTATION], tokens["eager"])


@pytest.mark.parametrize("name", MODELS)
def test_generate_with_kv_cache_gives_sdpa_tokens(torch_backend, name):
    check_generate(name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_generate_on_the_gpu(triton_backend, name):
    check_generate(name, "cuda")


def test_softcap_and_sliding_window_reach_the_kernels(torch_backend, monkeypatch):
    """Gemma2-style arguments: a softcap, and the sliding window without a mask."""
    from flashattn.integrations import transformers as integration

    seen = {}
    target = integration.attention_bhle

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return target(*args, **kwargs)

    monkeypatch.setattr(integration, "attention_bhle", spy)
    module = torch.nn.Module()
    query = torch.randn(1, 4, 12, 16, dtype=torch.float64).float()
    key, value = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    out, _ = integration.attention_forward(module, query, key, value, None, scaling=0.3, softcap=5.0,
                                           sliding_window=4)
    assert seen == {"softcap": 5.0, "sliding_window": 4, "mask_is_causal": False} and out.shape == (1, 12, 4, 16)
    # the same thing spelled out: softcap * tanh(scores / softcap), then keys i-3..i
    keys = key.repeat_interleave(2, dim=1).double()
    scores = 5.0 * torch.tanh(query.double() @ keys.transpose(-1, -2) * 0.3 / 5.0)
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    scores = scores.masked_fill((j > i) | (j < i - 3), float("-inf"))
    expected = (scores.softmax(-1) @ value.repeat_interleave(2, dim=1).double()).transpose(1, 2)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_the_integration_is_reached_from_import_flashattn():
    import flashattn

    assert flashattn.integrations.transformers.ATTN_IMPLEMENTATION == ATTN_IMPLEMENTATION
