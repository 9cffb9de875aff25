"""Bits per byte against a hand computation with a stub model: special tokens and ignored
targets count in neither sum, no bytes gives inf, batches that end early are evaluated
whole, two gloo ranks add their sums, and a split is read at most once."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from nanochat.loss_eval import evaluate_bpb

V = 12
BOS = 0
# bytes per token id: BOS is special (0 bytes), ids 1-11 are "text" of 1-4 bytes; the last id
# has bytes, so a -1 target read as an index (the last id) would be counted
TOKEN_BYTES = torch.tensor([0, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], dtype=torch.int32)


class StubModel:
    """Next-token logits from a fixed random (V, V) table; returns per-token nats as the GPT
    does for loss_reduction="none" (0 where the target is -1)."""

    def __init__(self, seed=0):
        self.table = torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * 2

    def logits(self, x):
        return self.table[x]

    def __call__(self, x, y, loss_reduction="mean"):
        assert loss_reduction == "none"
        logits = self.logits(x)
        return F.cross_entropy(logits.view(-1, V), y.reshape(-1), ignore_index=-1, reduction="none").view(y.shape)


def make_batches(seed, n, B=2, T=9):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, V, (B, T), generator=g)
        y = torch.randint(0, V, (B, T), generator=g)
        y[0, :2] = BOS                  # special targets: 0 bytes
        y[1, -3:] = -1                  # ignored targets
        out.append((x, y))
    return out


def hand_bpb(model, batches):
    """Position by position: nats of every target with bytes, over ln 2 times their bytes."""
    nats = nbytes = 0.0
    for x, y in batches:
        logits = model.logits(x)
        for b in range(y.shape[0]):
            for t in range(y.shape[1]):
                target = int(y[b, t])
                if target < 0 or TOKEN_BYTES[target] == 0:
                    continue
                row = logits[b, t].double()
                nats += float(torch.logsumexp(row, 0) - row[target])
                nbytes += int(TOKEN_BYTES[target])
    return nats / (math.log(2) * nbytes)


def test_bpb_matches_a_hand_computation():
    model, batches = StubModel(), make_batches(1, 3)
    result = evaluate_bpb(model, batches, 3, TOKEN_BYTES)
    assert result.bpb == pytest.approx(hand_bpb(model, batches), rel=1e-6)
    assert result.steps == 3 and result.tokens == 3 * 2 * 9 - 3 * 3 and not result.exhausted
    # only the first `steps` batches count
    assert evaluate_bpb(model, iter(batches), 2, TOKEN_BYTES).bpb == pytest.approx(hand_bpb(model, batches[:2]),
                                                                                    rel=1e-6)


def test_special_and_ignored_targets_count_nowhere():
    class Poisoned(StubModel):
        """Charges a huge or NaN loss at special and ignored targets: none may leak."""

        def __call__(self, x, y, loss_reduction="mean"):
            nats = super().__call__(x, y, loss_reduction)
            nats = torch.where(y == BOS, torch.full_like(nats, 1e6), nats)
            return torch.where(y < 0, torch.full_like(nats, float("nan")), nats)

    batches = make_batches(2, 2)
    assert evaluate_bpb(Poisoned(), batches, 2, TOKEN_BYTES).bpb == pytest.approx(hand_bpb(StubModel(), batches), rel=1e-6)


def test_no_bytes_is_inf_and_short_batches_are_evaluated_whole():
    x = torch.zeros(1, 4, dtype=torch.long)
    y = torch.tensor([[BOS, -1, BOS, -1]])
    assert evaluate_bpb(StubModel(), [(x, y)], 1, TOKEN_BYTES).bpb == float("inf")
    batches = make_batches(3, 2)
    result = evaluate_bpb(StubModel(), batches, 1000, TOKEN_BYTES)
    assert result.exhausted and result.steps == 2 and result.tokens == 2 * (2 * 9 - 3)
    assert result.bpb == pytest.approx(hand_bpb(StubModel(), batches), rel=1e-6)


def _bpb_worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # rank 1 runs out after one batch: the sums still meet, and both ranks know
        result = evaluate_bpb(StubModel(), make_batches(10 + rank, 2 - rank), 2, TOKEN_BYTES)
        Path(out_dir, f"bpb{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_ranks_add_their_sums(tmp_path):
    mp.spawn(_bpb_worker, args=(2, str(tmp_path / "rdv"), str(tmp_path)), nprocs=2)
    expected = hand_bpb(StubModel(), make_batches(10, 2) + make_batches(11, 1))
    for rank in range(2):
        bpb, tokens, steps, exhausted = json.loads((tmp_path / f"bpb{rank}.json").read_text())
        assert bpb == pytest.approx(expected, rel=1e-6)
        assert tokens == 3 * (2 * 9 - 3) and steps == 2 - rank and exhausted
    # and each rank alone would have reported something else
    assert hand_bpb(StubModel(), make_batches(10, 2)) != pytest.approx(expected, rel=1e-6)
