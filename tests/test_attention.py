"""The attention backends on CPU: FlexAttention (forward; eager) against SDPA for every
window pattern, at a length that is not a multiple of FlexAttention's 128-token blocks,
through the KV cache, in a compiled trace, and the `attention` config field in checkpoints."""

import dataclasses

import pytest
import torch

from nanochat import gpt
from nanochat.checkpoint_manager import model_from_state
from nanochat.gpt import GPTConfig, KVCache, attention_backend, build_model

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

VOCAB = 64


def _model(attention, window_pattern="SSSL", hc="residual", n_layer=3, seq_len=160, seed=0):
    """A tiny GPT (GQA: 4 query heads over 2 kv heads) whose zero-initialized projections
    are perturbed, so that every attention layer shapes the logits."""
    cfg = GPTConfig(sequence_len=seq_len, vocab_size=VOCAB, n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=64,
                    window_pattern=window_pattern, attention=attention, hc=hc, hc_streams=0 if hc == "residual" else 4)
    torch.manual_seed(seed)
    model = build_model(cfg, "cpu")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


def _tokens(B, T, seed=3):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("window_pattern", ["SSSL", "S", "L", "SL", "LS"])
@pytest.mark.parametrize("hc", ["residual", "kromhc"])
def test_flex_equals_sdpa(window_pattern, hc):
    # T = 160, the training length (flex serves no other): windows of 80 (S); 160 > 128 spans
    # two blocks, the last one partial.
    idx = _tokens(2, 160)
    with torch.no_grad():
        want = _model("sdpa", window_pattern, hc)(idx)
        got = _model("flex", window_pattern, hc)(idx)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_flex_model_serves_prompts_of_any_length():
    idx = _tokens(1, 300)  # > sequence_len 160: evaluation prompts of any length (on SDPA)
    with torch.no_grad():
        want = _model("sdpa")(idx)
        got = _model("flex")(idx)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_flex_model_decodes_through_the_kv_cache():
    """Prefill 100 tokens, then one token at a time through the cache: the logits equal
    the flex model's (and the sdpa model's) full forward over the whole sequence."""
    model, ref = _model("flex"), _model("sdpa")
    idx = _tokens(2, 130)
    with torch.no_grad():
        full = model(idx)
        torch.testing.assert_close(full, ref(idx), rtol=1e-5, atol=1e-5)
        cache = KVCache(2, 3, 2, model.head_dim, 130, "cpu", torch.float32)
        steps = [model(idx[:, :100], kv_cache=cache)]
        for t in range(100, 130):
            steps.append(model(idx[:, t:t + 1], kv_cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_flex_casts_mixed_inputs_as_autocast_casts_sdpa():
    """Under CUDA autocast rms_norm returns fp32, so q and k reach the kernel in fp32 beside
    a bf16 v; SDPA is cast to the autocast dtype, and FlexAttention must be too."""
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 4, 150, 16, generator=gen), torch.randn(2, 2, 150, 16, generator=gen)
    v = torch.randn(2, 2, 150, 16, generator=gen).bfloat16()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = gpt.sdpa_attend(q, k, v, 80, enable_gqa=True)
        got = gpt.flex_attend(q, k, v, 80, enable_gqa=True)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_block_mask_is_built_once_and_reused():
    """The training length's masks are built with the model (outside any compiled region)
    and every later forward reuses them; other lengths (evaluation prompts) run on SDPA and
    build none: in eager CUDA FlexAttention each new mask would recompile the kernel."""
    gpt._BLOCK_MASKS.clear()
    model = _model("flex")
    cpu = torch.device("cpu")
    assert list(gpt._BLOCK_MASKS) == [(160, 80, cpu)]  # two S layers, one window
    built = gpt._BLOCK_MASKS[(160, 80, cpu)]
    with torch.no_grad():
        model(_tokens(1, 160))
        model(_tokens(1, 150))
        model(_tokens(1, 300))
        model(_tokens(1, 160))
    assert gpt._BLOCK_MASKS == {(160, 80, cpu): built}


@pytest.mark.parametrize("T, autocast", [(160, False), (160, True), (150, False)],
                         ids=["flex", "flex-bf16-autocast", "other-length-sdpa"])
def test_flex_model_traces_as_one_graph(T, autocast):
    """At the training length the block mask comes from the cache; under autocast the inputs
    are cast; another length takes SDPA. Nothing breaks the graph."""
    model, idx = _model("flex", hc="kromhc"), _tokens(1, T)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        explained = torch._dynamo.explain(model)(idx)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_attention_backend_resolution():
    assert attention_backend("auto", "cpu") == "sdpa"
    assert attention_backend("auto", torch.device("cuda", 0)) == "flex"
    assert attention_backend("sdpa", "cuda") == "sdpa" and attention_backend("flex", "cpu") == "flex"
    with pytest.raises(ValueError, match="auto, flex, sdpa"):
        GPTConfig(attention="fa3")


def test_attention_field_roundtrips_and_old_checkpoints_load():
    model = _model("flex")
    config = dataclasses.asdict(model.config)
    assert config["attention"] == "flex"
    assert model_from_state(config, model.state_dict(), "cpu").config.attention == "flex"
    del config["attention"]  # a checkpoint written before the field existed
    assert model_from_state(config, model.state_dict(), "cpu").config.attention == "auto"
