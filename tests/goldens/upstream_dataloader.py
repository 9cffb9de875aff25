"""Golden batches of nanochat's own best-fit dataloader at commit 92d63d4 (the 2026-07 trunk).

    git clone https://github.com/karpathy/nanochat && git -C nanochat checkout 92d63d4
    python tests/goldens/upstream_dataloader.py --nanochat nanochat --out tests/goldens/dataloader_92d63d4.json

Runs in its own process with that checkout first on sys.path (its package is also called
`nanochat`; ours is never imported here). Writes the corpus below (CORPUS: train shards and
the last one, ClimbMix's val shard 06542, as nanochat 92d63d4 names them) into
$NANOCHAT_BASE_DIR/base_data_climbmix of a temporary directory, where its
nanochat/dataset.py looks, gives its loader its own tokenizer class over the ranks below,
sets the ranks through the torchrun variables its get_dist_info reads, and records, for each
of RUNS, the sha256 of every batch (x then y, int64) and a few readable numbers.
tests/test_dataloader_2026.py builds the same corpus and tokenizer for our BestFitLoader.

Both are built here without nanochat, from a fixed seed: documents of 1 to ~110 tokens over
a small vocabulary (so that rows hold several documents and some are cropped), and a
tokenizer whose merges are the prefixes of those words (a valid BPE: each token is its
prefix plus one byte), so that no BPE training run is involved.
"""

import hashlib
import json
import os
import random
import sys
import tempfile
import types

from upstream import COMMIT, open_checkout

SEED = 20260703
WORDS = ("the", "model", "residual", "stream", "connection", "hyper", "matrix", "layer", "token", "train",
         "loss", "data", "mix", "climb", "shard", "row", "group", "batch", "best", "fit", "crop", "document",
         "width", "depth", "mani", "fold", "doubly", "stochastic", "kron", "ecker", "café", "naïve")
PUNCT = (".", ",", ";", "\n", " 12", " 2026", "!", "?")
# (train shard documents, row group size, val documents): row groups of 32, one short group
# per shard, so that rank strides and tokenizer batches do not line up with the files.
CORPUS = dict(train_shards=3, shard_docs=120, row_group=32, val_docs=96)
VAL_SHARD = 6542  # ClimbMix's (nanochat 92d63d4, nanochat/dataset.py MAX_SHARD)
# Loader settings both loaders get: a buffer below one rank's share of the split (ours holds
# at most that share), tokenizer batches that cut the row groups.
LOADER = dict(buffer_size=48, tokenizer_batch_size=16)
RUNS = (
    dict(split="train", B=4, T=64, rank=0, world_size=2, batches=24),
    dict(split="train", B=4, T=64, rank=1, world_size=2, batches=24),
    dict(split="train", B=2, T=32, rank=0, world_size=1, batches=40),
    dict(split="val", B=2, T=48, rank=0, world_size=1, batches=12),
)
SPECIALS = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
            "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>")
# nanochat's split pattern (nanochat/tokenizer.py SPLIT_PATTERN at 92d63d4)
PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
           r"""|\s*[\r\n]|\s+(?!\S)|\s+""")


def documents():
    """[train shard 0 docs, shard 1 docs, ..., val docs]: the corpus, from SEED alone."""
    rng = random.Random(SEED)

    def doc():
        n = rng.choice((1, 2, 3, 5, 8, 13, 21, 34, 55)) + rng.randrange(4)
        words = [rng.choice(WORDS) + (rng.choice(PUNCT) if rng.random() < 0.15 else "") for _ in range(n)]
        return " ".join(words)

    shards = [[doc() for _ in range(CORPUS["shard_docs"])] for _ in range(CORPUS["train_shards"])]
    return shards + [[doc() for _ in range(CORPUS["val_docs"])]]


def shard_files():
    """(file name, documents) of every shard, in nanochat's names."""
    docs = documents()
    names = [f"shard_{i:05d}.parquet" for i in range(CORPUS["train_shards"])] + [f"shard_{VAL_SHARD:05d}.parquet"]
    return list(zip(names, docs))


def mergeable_ranks():
    """tiktoken ranks: the 256 bytes, then every prefix (2 bytes and up) of each word, bare and
    after a space, in order of first appearance."""
    ranks = {bytes([b]): b for b in range(256)}
    for word in WORDS:
        for form in (word, " " + word):
            raw = form.encode()
            for k in range(2, len(raw) + 1):
                ranks.setdefault(raw[:k], len(ranks))
    return ranks


def special_tokens():
    """The specials on the ids after the merges, <|bos|> first (nanochat's layout)."""
    n = len(mergeable_ranks())
    return {name: n + i for i, name in enumerate(SPECIALS)}


def batch_digest(x, y):
    """sha256 of a batch: x then y as int64, C order."""
    import numpy as np
    return hashlib.sha256(np.ascontiguousarray(x, dtype="<i8").tobytes()
                          + np.ascontiguousarray(y, dtype="<i8").tobytes()).hexdigest()


def summarize(batches, bos):
    """What the golden records of one run's batches."""
    return {"sha256": [batch_digest(x, y) for x, y in batches],
            "first_row": [int(t) for t in batches[0][0][0][:16]],
            "bos_count": int(sum((x == bos).sum() for x, _ in batches)),
            "token_sum": int(sum(x.sum() + y.sum() for x, y in batches))}


def write_shards(directory):
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(directory, exist_ok=True)
    for name, docs in shard_files():
        pq.write_table(pa.table({"text": pa.array(docs, type=pa.string())}), os.path.join(directory, name),
                       row_group_size=CORPUS["row_group"], compression="zstd", use_dictionary=False,
                       write_statistics=False)


def main():
    args = open_checkout(__doc__.splitlines()[0], torch_eager=False)
    base = tempfile.mkdtemp(prefix="nanochat_upstream_loader_")
    os.environ["NANOCHAT_BASE_DIR"] = base  # read once, when its nanochat.dataset is imported
    write_shards(os.path.join(base, "base_data_climbmix"))
    sys.modules["rustbpe"] = types.ModuleType("rustbpe")  # imported by its tokenizer module, used only to train
    import tiktoken
    from nanochat.dataloader import tokenizing_distributed_data_loader_with_state_bos_bestfit as loader  # at COMMIT
    from nanochat.tokenizer import RustBPETokenizer

    enc = tiktoken.Encoding(name="golden", pat_str=PATTERN, mergeable_ranks=mergeable_ranks(),
                            special_tokens=special_tokens())
    tok = RustBPETokenizer(enc, "<|bos|>")
    golden = {"commit": COMMIT, "seed": SEED, "corpus": CORPUS, "loader": LOADER, "runs": []}
    for run in RUNS:
        # its get_dist_info reads these when the generator first runs
        os.environ.update(RANK=str(run["rank"]), LOCAL_RANK=str(run["rank"]), WORLD_SIZE=str(run["world_size"]))
        batches = []
        it = loader(tok, run["B"], run["T"], run["split"], device="cpu", **LOADER)
        for _ in range(run["batches"]):
            x, y, _ = next(it)
            batches.append((x.numpy().copy(), y.numpy().copy()))  # it reuses its buffers
        golden["runs"].append(dict(run, **summarize(batches, tok.get_bos_token_id())))
        print(f"{run}: {golden['runs'][-1]['sha256'][-1][:16]}")
    with open(args.out, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
