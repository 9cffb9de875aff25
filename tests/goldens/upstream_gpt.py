"""Golden values of nanochat's own GPT at commit 92d63d4 (the 2026-07 trunk), from its code.

    git clone https://github.com/karpathy/nanochat && git -C nanochat checkout 92d63d4
    python tests/goldens/upstream_gpt.py --nanochat nanochat --out tests/goldens/gpt_92d63d4.json

Runs in its own process with that checkout first on sys.path (its package is also called
`nanochat`; ours is never imported here), on the CPU, with torch.compile disabled (its
optimizer compiles its step functions; eager is the same math) and, but for the init, in fp64
(its parameters cast, and upstream.run_in_float64: its compute dtype, its `.float()` casts,
its rotary tables). Records the fingerprints (weights.fingerprint) of, for a tiny model
(SHAPE) and one batch (weights.batch):
  init     every parameter after its init_weights under torch.manual_seed(SEED), drawn in
           fp32 as nanochat draws them
  logits   the logits, and the loss, of the model in fp64 with every parameter set by name
           (weights.tensor_for)
  grads    every parameter's gradient of that loss
  step     every parameter after one step of its MuonAdamW with the groups of its
           setup_optimizer(**OPTIMIZER)
tests/test_trunk_2026_07.py gives our model the same weights and batch and compares them.
"""

import json

from upstream import COMMIT, open_checkout, run_in_float64

SHAPE = dict(sequence_len=512, vocab_size=300, n_layer=4, n_head=4, n_kv_head=2, n_embd=64, window_pattern="SL")
BATCH = dict(B=2, T=160)  # T > the short window (128 at sequence_len 512), so the windows mask
SEED = 0
OPTIMIZER = dict(unembedding_lr=0.004, embedding_lr=0.2, matrix_lr=0.02, weight_decay=0.1, scalar_lr=0.5)


def offsets(name):
    """The mean a parameter is drawn around (the per-layer scalars near their roles)."""
    return 1.0 if name == "resid_lambdas" else 0.0


def main():
    args = open_checkout(__doc__.splitlines()[0])
    run_in_float64()
    import torch
    from nanochat.gpt import GPT, GPTConfig  # nanochat at COMMIT
    from weights import batch, fingerprint, tensor_for

    def fresh():
        with torch.device("meta"):
            model = GPT(GPTConfig(**SHAPE))
        model.to_empty(device="cpu")
        return model

    torch.manual_seed(SEED)
    model = fresh()  # fp32 parameters: the draws as nanochat makes them
    model.init_weights()
    golden = {"commit": COMMIT, "shape": SHAPE, "batch": BATCH, "seed": SEED, "optimizer": OPTIMIZER,
              "init": {name: fingerprint(p) for name, p in model.named_parameters()}}

    model = fresh().to(torch.float64)
    model.init_weights()  # buffers (rotary tables, in fp64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensor_for(name, p.shape, offsets(name)))
    assert {p.dtype for p in model.parameters()} == {model.cos.dtype} == {torch.float64}
    idx, targets = batch(SHAPE["vocab_size"], **BATCH)
    with torch.no_grad():
        golden["logits"] = fingerprint(model(idx))
    loss = model(idx, targets)
    loss.backward()
    golden["loss"] = fingerprint(loss)
    golden["grads"] = {name: fingerprint(p.grad) for name, p in model.named_parameters()}
    optimizer = model.setup_optimizer(**OPTIMIZER)
    optimizer.step()
    golden["step"] = {name: fingerprint(p) for name, p in model.named_parameters()}
    with open(args.out, "w") as f:
        json.dump(golden, f, indent=1)
    print(f"wrote {args.out}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
