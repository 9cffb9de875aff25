"""The trunk belongs to the connections: `StreamConnections(x0, branches)` runs expand, the
layer loop with whatever a variant carries, and reduce. gpt.py only builds branches.

Pinned here: for every variant at the paper's options the model computes exactly (bitwise,
fp32) what the loop gpt.py ran before the connections owned it computes; a variant whose
layers carry state from one layer to the next runs without any change to gpt.py; and the
whole model stays one compiled graph without breaks for every variant and option (attnres
carries its block states as a list of tensors, frac's state is a view)."""

import types

import pytest
import torch
import torch._dynamo

from nanochat import connections
from nanochat.connections import hc
from nanochat.connections.frame import ConnectionLayer, SumReduce
from nanochat.gpt import GPTConfig, build_model, norm

VOCAB = 300
CASES = [dict(hc="residual"), dict(hc="hc"), dict(hc="hc_identity"), dict(hc="mhc"),
         dict(hc="mhc_lite", hc_streams=3), dict(hc="kromhc", hc_streams=6),
         dict(hc="kromhc", hc_alpha_shared=False), dict(hc="mhc", value_embeds=False)]


def case_id(case):
    return "-".join(str(v) for v in case.values())


def tiny(n_layer=2, **fields):
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=32,
                    window_pattern="SL", **fields)
    model = build_model(cfg, "cpu")
    with torch.no_grad():  # away from the zero-initialized projections, so every path matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def loop_as_gpt_ran_it(model, idx):
    """The trunk as gpt.py wrote it before StreamConnections owned it: expand, then
    X = layers[j](X, branch, x0) block by block, then reduce."""
    T = idx.size(1)
    cos, sin = model.cos[:, :T], model.sin[:, :T]
    x0 = norm(model.transformer.wte(idx))
    conn = model.connections
    X = conn.expand(x0)
    for i, block in enumerate(model.transformer.h):
        ve = model.value_embeds[str(i)](idx) if str(i) in model.value_embeds else None
        X = conn.layers[2 * i](X, lambda u: block.attn(norm(u), ve, (cos, sin), model.window_sizes[i], None), x0)
        X = conn.layers[2 * i + 1](X, lambda u: block.mlp(norm(u)), x0)
    logits = model.lm_head(norm(conn.reduce(X)))[..., :VOCAB].float()
    return 15 * torch.tanh(logits / 15)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_logits_equal_the_loop_gpt_ran_bitwise(case):
    model = tiny(**case)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(idx), loop_as_gpt_ran_it(model, idx))


class CountingLayer(ConnectionLayer):
    """A variant of the test's own: a residual add that carries the running sum of the
    branch outputs from layer to layer and hands it to reduce."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.capture = None

    def init_weights(self):
        pass

    def step(self, X, branch, x0, carry):
        y = branch(X.squeeze(-2))
        carry = y if carry is None else carry + y
        return X + self.scale * y.unsqueeze(-2), carry


class CarryReduce(SumReduce):
    def forward(self, X, carry=None):
        return X.squeeze(-2) + carry


def test_a_variant_carries_state_between_layers_without_touching_gpt(monkeypatch):
    counting = types.SimpleNamespace(
        SPEC=dict(label="Counting", description="a residual add carrying the sum of the branch outputs",
                  source="tests", state="single", has_h_res=False, in_paper=False, equals_prenorm_at_init=False,
                  params=lambda cfg: 2 * cfg.n_layer),
        resolve=lambda cfg: setattr(cfg, "hc_streams", 1),
        make_layers=lambda cfg: [CountingLayer() for _ in range(2 * cfg.n_layer)],
        make_reduce=lambda cfg: CarryReduce())
    monkeypatch.setitem(connections.VARIANTS, "counting", counting)
    model = tiny(hc="counting")
    seen = []
    for layer in model.connections.layers:  # record what each layer receives as carry
        orig = layer.step
        layer.step = lambda X, branch, x0, carry, orig=orig: seen.append(carry) or orig(X, branch, x0, carry)
    idx = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(2))
    model(idx).sum().backward()
    assert seen[0] is None and all(c is not None for c in seen[1:]) and len(seen) == 4
    assert all(layer.scale.grad is not None for layer in model.connections.layers)


@pytest.mark.parametrize("case", [dict(hc="residual"), dict(hc="kromhc"), dict(hc="go_mhc"), dict(hc="frac"),
                                  dict(hc="frac", hc_recompute=True), dict(hc="attnres")], ids=case_id)
def test_one_graph_without_breaks(case):
    model = tiny(**case)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(idx, idx)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_branches_must_match_the_layers():
    model = tiny(hc="mhc")
    with pytest.raises(ValueError, match="3 branches for 4 connection layers"):
        model.connections(torch.zeros(1, 4, 32), [lambda u: u] * 3)


def test_hc_layer_signature_is_unchanged_for_a_single_step():
    model = tiny(hc="kromhc")
    layer = model.connections.layers[1]
    assert isinstance(layer, hc.HyperConnection)
    X = torch.randn(1, 4, 4, 32)
    out, carry = layer.step(X, torch.tanh, None, "untouched")
    assert torch.equal(layer(X, torch.tanh), out) and carry == "untouched"
