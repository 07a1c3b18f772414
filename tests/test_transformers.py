"""flashattn as a transformers attention implementation: tiny random Llama, Qwen2 and Mistral models (GPT-OSS and
DeepSeek-V3 for attention sinks and a value head dim of its own).

Logits, one training step's gradients and generate() with a KV cache against transformers' own "eager"
and "sdpa" implementations. The oracle is "sdpa" in float64 ("eager" in float64 turns left-padded rows
into NaN: its -finfo.max mask overflows); the baselines that set the tolerance are "eager" and "sdpa"
in the test's dtype. Models come from configs: nothing is downloaded.
"""

import importlib

import pytest
import torch
from test_sinks import assert_sinks_within_rule, lse_floor, reference_leaves, sink_attention

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
# models without an "sdpa" implementation: GPT-OSS's attention sinks (its experts take no float64, so its oracle is
# its own attention function in float64), and DeepSeek-V3's latent attention, whose value head dim (16) is not the
# query's (24)
EAGER_ONLY = {
    "gpt_oss": lambda: transformers.GptOssConfig(**{**COMMON, "intermediate_size": 64}, head_dim=16, sliding_window=6,
                                                 num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(
        **{**COMMON, "num_key_value_heads": 4}, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=2,
        n_group=1, topk_group=1),
}


def build(name: str, implementation: str, dtype=torch.float32, state=None, device="cpu"):
    config = {**CONFIGS, **EAGER_ONLY}[name]()
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


@pytest.mark.parametrize("side", ["right", "none"])  # eager in float64 turns left-padded rows into NaN
def test_latent_attention_matches_eager(torch_backend, side):
    """DeepSeek-V3: logits at the real tokens and one training step's gradients within the rule of eager in
    float32 (oracle: eager in float64)."""
    ids, mask = padded_batch(side)
    labels = ids.masked_fill(mask == 0, -100)
    state = build("deepseek_v3", "eager").state_dict()

    def step(implementation, dtype):
        model = build("deepseek_v3", implementation, dtype, state).train()
        logits = model(input_ids=ids, attention_mask=mask).logits
        torch.nn.functional.cross_entropy(logits[mask.bool()], labels[mask.bool()]).backward()
        return logits.detach()[mask.bool()], {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    logits, grads = step(ATTN_IMPLEMENTATION, torch.float32)
    oracle_logits, oracle_grads = step("eager", torch.float64)
    baseline_logits, baseline_grads = step("eager", torch.float32)
    assert_within_rule("logits", logits, oracle_logits, baseline_logits, factor=2)
    assert grads.keys() == oracle_grads.keys()
    for param in grads:
        assert_within_rule(param, grads[param], oracle_grads[param], baseline_grads[param], factor=3)


@pytest.mark.parametrize("masked", [False, True])
def test_sinks_match_gpt_oss_attention(torch_backend, masked):
    """GPT-OSS's attention function (its sinks a parameter per head, GQA, a padding and causal mask) against ours:
    the output and the gradients of q, k, v and the sinks, within the rule of it in float32 (oracle: float64)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from flashattn.integrations.transformers import attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 2, True, False
    query, key, value = torch.randn(2, 4, 13, 16), torch.randn(2, 2, 13, 16), torch.randn(2, 2, 13, 16)
    sinks, grad = torch.randn(4), torch.randn(2, 13, 4, 16)
    mask = None
    if masked:
        mask = torch.ones(13, 13, dtype=torch.bool).tril().repeat(2, 1, 1, 1)
        mask[1, ..., :4] = False  # the second sequence left-padded by 4 (its padded rows see the sink only)
        mask[1, ..., :4, 0] = True  # ... and their first key, so that every row stays finite in eager

    causal = torch.ones(13, 13, dtype=torch.bool).tril()

    def run(function, dtype):
        leaves = [x.to(dtype).requires_grad_() for x in (query, key, value, sinks)]
        if function is attention_forward:
            out, _ = function(module, *leaves[:3], mask, scaling=0.25, s_aux=leaves[3])
        else:  # eager takes the sinks from the module, and the causal part of the mask spelled out
            module.sinks = leaves[3]
            additive = torch.zeros(13, 13, dtype=dtype).masked_fill(~(causal if mask is None else mask), -torch.inf)
            out, _ = function(module, *leaves[:3], additive, scaling=0.25)
        return out, torch.autograd.grad(out, leaves, grad.to(dtype))

    out, grads = run(attention_forward, torch.float32)
    oracle, oracle_grads = run(eager_attention_forward, torch.float64)
    baseline, baseline_grads = run(eager_attention_forward, torch.float32)
    assert_within_rule("out", out, oracle, baseline, factor=2)
    for name, ours, exact, plain in zip(("dq", "dk", "dv"), grads, oracle_grads, baseline_grads, strict=False):
        assert_within_rule(name, ours, exact, plain, factor=3)
    exact, lse = sink_attention(query.double(), key.double(), value.double(), sinks.double(),
                                causal if mask is None else mask, False, with_lse=True)
    floor = lse_floor(exact, lse, sinks.double(), grad.transpose(1, 2).double())
    assert_within_rule("dsinks", grads[3], oracle_grads[3], baseline_grads[3], factor=3, floor=floor)


def test_gpt_oss_generate_gives_eager_tokens(torch_backend):
    ids, mask = padded_batch("left")
    state = build("gpt_oss", "eager").state_dict()
    tokens = [build("gpt_oss", implementation, state=state).generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
        for implementation in (ATTN_IMPLEMENTATION, "eager")]
    assert torch.equal(*tokens)


@pytest.mark.parametrize("module_is_causal", [True, None])
def test_a_mask_is_taken_as_it_is(torch_backend, module_is_causal):
    """A causal model's mask may show later keys (Gemma 3's image tokens see each other both ways), and a module
    without ``is_causal`` (an encoder's, a cross-attention's) gets a mask with no causal part: the mask alone
    decides, as in transformers' sdpa."""
    from flashattn.integrations.transformers import attention_forward

    module = torch.nn.Module()
    if module_is_causal is not None:
        module.is_causal = module_is_causal
    query, key, value = (torch.randn(2, 4, 11, 16) for _ in range(3))
    mask = torch.ones(11, 11, dtype=torch.bool).tril()
    mask[2:6, 2:6] = True  # a block that sees itself both ways
    mask = mask.expand(2, 1, 11, 11)
    out, _ = attention_forward(module, query, key, value, mask)
    exact = torch.nn.functional.scaled_dot_product_attention(query.double(), key.double(), value.double(), mask)
    plain = torch.nn.functional.scaled_dot_product_attention(query, key, value, mask)
    assert_within_rule("out", out.transpose(1, 2), exact, plain, factor=2)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_packed_batch_by_cu_seq_lens_matches_separate_sequences(torch_backend, name):
    """transformers' flash-attention kwargs for a packed row (``DataCollatorWithFlattening`` with
    ``return_flash_attn_kwargs=True``): each sequence sees only itself, as if run alone."""
    lengths = (11, 5, 8)
    sequences = [torch.randint(1, VOCAB, (n,)) for n in lengths]
    cu_seqlens = torch.tensor([0, 11, 16, 24], dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    packed = dict(input_ids=torch.cat(sequences)[None], position_ids=positions, cu_seq_lens_q=cu_seqlens,
                  cu_seq_lens_k=cu_seqlens, max_length_q=11, max_length_k=11, use_cache=False)
    state = build(name, "eager").state_dict()

    def alone(dtype):
        model = build(name, "sdpa", dtype, state)
        return torch.cat([model(input_ids=s[None]).logits[0] for s in sequences])

    with torch.no_grad():
        logits = build(name, ATTN_IMPLEMENTATION, state=state)(**packed).logits[0]
        oracle, baseline = alone(torch.float64), alone(torch.float32)
    assert_within_rule("packed logits", logits, oracle, baseline, factor=2)


def test_packed_batch_takes_sinks(torch_backend):
    """GPT-OSS's sinks (``s_aux``) on a packed row (``cu_seq_lens_q``): each sequence's causal attention with the
    sinks, output and gradients (the sinks' included) within the rule against the float64 reference."""
    from flashattn.integrations.transformers import attention_forward

    lengths, cu_seqlens = (11, 5, 8), torch.tensor([0, 11, 16, 24], dtype=torch.int32)
    module = torch.nn.Module()
    module.is_causal = True
    # bf16, as GPT-OSS runs: in float32 the rule compares rounding noise, a few ulps either way
    query, key, value = (torch.randn(1, h, 24, 16, dtype=torch.bfloat16) for h in (4, 2, 2))
    sinks, grad = torch.randn(4), torch.randn(1, 24, 4, 16, dtype=torch.bfloat16)
    leaves = [x.requires_grad_() for x in (query, key, value, sinks)]
    out, _ = attention_forward(module, *leaves[:3], None, scaling=0.25, s_aux=leaves[3], cu_seq_lens_q=cu_seqlens,
                               cu_seq_lens_k=cu_seqlens)
    grads = torch.autograd.grad(out, leaves, grad)

    def run(dtype):
        inputs = reference_leaves(leaves, dtype)
        # the reference's scale, 1 / sqrt(16), is the call's scaling
        parts = [sink_attention(*(x[:, :, start:start + n] for x in inputs[:3]), inputs[3], None, True)
                 for start, n in zip(cu_seqlens.tolist(), lengths, strict=False)]
        result = torch.cat(parts, 2).transpose(1, 2)
        return result, torch.autograd.grad(result, inputs, grad.to(dtype))

    assert_sinks_within_rule(out, grads, run, torch.bfloat16, 0.0)


def test_output_attentions_warns():
    from flashattn.integrations.transformers import attention_forward

    query = torch.randn(1, 2, 3, 16)
    with pytest.warns(UserWarning, match="output_attentions=True gets no attention weights"):
        attention_forward(torch.nn.Module(), query, query, query, None, output_attentions=True)


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
    assert seen == {"softcap": 5.0, "sliding_window": 4, "sinks": None} and out.shape == (1, 12, 4, 16)
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
