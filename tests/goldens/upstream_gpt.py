"""Golden values of nanochat's own GPT at commit 92d63d4 (the 2026-07 trunk), from its code.

    git clone https://github.com/karpathy/nanochat && git -C nanochat checkout 92d63d4
    python tests/goldens/upstream_gpt.py --nanochat nanochat --out tests/goldens/gpt_92d63d4.json

Runs in its own process with that checkout first on sys.path (its package is also called
`nanochat`; ours is never imported here), on the CPU in fp32 (NANOCHAT_DTYPE=float32), with
torch.compile disabled (its optimizer compiles its step functions; eager is the same math).
Records, for a tiny model (SHAPE) and one batch (weights.batch):
  init     every parameter after its init_weights under torch.manual_seed(SEED)
  logits   the logits, and the loss, with every parameter set by name (weights.tensor_for)
  grads    every parameter's gradient of that loss
  step     every parameter after one step of its MuonAdamW with the groups of its
           setup_optimizer(**OPTIMIZER)
tests/test_trunk_2026_07.py gives our model the same weights and batch and compares digests.
"""

import json

from upstream import COMMIT, open_checkout

SHAPE = dict(sequence_len=512, vocab_size=300, n_layer=4, n_head=4, n_kv_head=2, n_embd=64, window_pattern="SL")
BATCH = dict(B=2, T=160)  # T > the short window (128 at sequence_len 512), so the windows mask
SEED = 0
OPTIMIZER = dict(unembedding_lr=0.004, embedding_lr=0.2, matrix_lr=0.02, weight_decay=0.1, scalar_lr=0.5)


def offsets(name):
    """The mean a parameter is drawn around (the per-layer scalars near their roles)."""
    return 1.0 if name == "resid_lambdas" else 0.0


def main():
    args = open_checkout(__doc__.splitlines()[0])
    import torch
    from nanochat.gpt import GPT, GPTConfig  # nanochat at COMMIT
    from weights import batch, digest, tensor_for

    def fresh():
        with torch.device("meta"):
            model = GPT(GPTConfig(**SHAPE))
        model.to_empty(device="cpu")
        return model

    torch.manual_seed(SEED)
    model = fresh()
    model.init_weights()
    golden = {"commit": COMMIT, "shape": SHAPE, "batch": BATCH, "seed": SEED, "optimizer": OPTIMIZER,
              "init": {name: digest(p) for name, p in model.named_parameters()}}

    model = fresh()
    model.init_weights()  # buffers (rotary tables)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensor_for(name, p.shape, offsets(name)))
    idx, targets = batch(SHAPE["vocab_size"], **BATCH)
    with torch.no_grad():
        golden["logits"] = digest(model(idx))
    loss = model(idx, targets)
    loss.backward()
    golden["loss"] = digest(loss)
    golden["grads"] = {name: digest(p.grad) for name, p in model.named_parameters()}
    optimizer = model.setup_optimizer(**OPTIMIZER)
    optimizer.step()
    golden["step"] = {name: digest(p) for name, p in model.named_parameters()}
    with open(args.out, "w") as f:
        json.dump(golden, f, indent=1)
    print(f"wrote {args.out}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
