"""--compile-mode (nanochat/gpt.py: `compiled`, GPT.compile_regions): the model compiled whole or
regionally computes what the eager model computes, and regionally each repeated region is
compiled once, however deep the model. Dynamo only (a counting backend, no code generation:
compiling with Inductor costs ~30 s a graph on this CPU)."""

import pytest
import torch
import torch._dynamo

from nanochat.gpt import GPTConfig, build_model, compiled


def tiny(depth, **fields):
    torch.manual_seed(0)
    cfg = GPTConfig(**{"sequence_len": 16, "vocab_size": 64, "n_layer": depth, "n_head": 2, "n_kv_head": 2,
                       "n_embd": 32, "window_pattern": "L", **fields})
    model = build_model(cfg, "cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


def loss_and_grads(model, run, idx):
    model.zero_grad(set_to_none=True)
    loss = run(idx, idx)
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


class Graphs:
    """A dynamo backend that counts the graphs it is handed and runs them as they are."""

    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


@pytest.mark.parametrize("mode", ["whole", "regional"])
@pytest.mark.parametrize("hc", ["residual", "kromhc", "attnres"])
def test_compiled_equals_eager(hc, mode):
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    model = tiny(2, hc=hc)
    loss_e, grads_e = loss_and_grads(model, model, idx)
    torch._dynamo.reset()
    loss_c, grads_c = loss_and_grads(model, compiled(model, mode, backend=Graphs()), idx)
    torch.testing.assert_close(loss_c, loss_e)
    for name, g in grads_e.items():
        torch.testing.assert_close(grads_c[name], g, msg=name)


@pytest.mark.parametrize("hc, graphs", [("residual", 4), ("kromhc", 6), ("mhc", 6)])
def test_regions_compile_once_whatever_the_depth(hc, graphs):
    """Depth 2 and depth 6 compile the same graphs: each attention setting (here the value
    embedding's gate on alternate layers), the MLP, the head and an HC layer's read and write
    (the residual baseline's layer runs eagerly between its compiled sub-layers)."""
    counts = []
    for depth in (2, 6):
        torch._dynamo.reset()
        backend = Graphs()
        model = tiny(depth, hc=hc)
        compiled(model, "regional", backend=backend)(*(torch.zeros(1, 16, dtype=torch.long),) * 2).backward()
        counts.append(backend.count)
    assert counts[0] == counts[1] == graphs, counts


def test_an_unknown_mode_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown compile mode 'partial'; choose one of whole, regional"):
        compiled(tiny(1), "partial")
