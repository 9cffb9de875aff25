"""End to end through the GPT: a tiny model of every variant learns a fixed batch, its
connection parameters move, and the Figure-2 diagnostic still holds after training."""

import pytest
import torch

from nanochat import connections
from nanochat.connections.diagnostics import collect_hc_stats
from nanochat.gpt import GPTConfig, build_model

VOCAB = 64
STEPS = 50


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: threading only adds contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("variant, streams", [(name, 0) for name in connections.VARIANTS]
                         + [("mhc_lite", 3), ("kromhc", 6)])
def test_tiny_model_trains(variant, streams):
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, hc=variant,
                    hc_streams=streams)
    model = build_model(cfg, "cpu")
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, VOCAB, (4, 17), generator=g)
    x, y = batch[:, :-1], batch[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.95), weight_decay=0.0)
    before = {name: p.detach().clone() for name, p in model.connections.named_parameters()}
    losses, learning = [], set()
    for _ in range(STEPS):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for name, p in model.connections.named_parameters():
            assert p.grad is not None, name  # the optimizer stacks every grad: none may be missing
            if p.grad.abs().sum() > 0:
                learning.add(name)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    moved = {name for name, p in model.connections.named_parameters() if not torch.equal(p, before[name])}
    # Every parameter that got a gradient moved, and most did; those that never get one by
    # their wiring's math (a read over one source) are named in the wiring's own test.
    assert moved == learning and len(moved) >= len(before) / 2, sorted(set(before) - moved)
    stats = collect_hc_stats(model, x)
    if variant in ("mhc_lite", "kromhc"):
        assert stats["composite_col_mae"] < 1e-6 and stats["composite_row_mae"] < 1e-6
    if variant == "go_mhc":  # exact to the rounding of an fp32 inverse
        assert stats["composite_col_mae"] < 1e-5 and stats["composite_row_mae"] < 1e-5
    if variant == "mhc":
        assert stats["composite_col_mae"] < 1e-6
