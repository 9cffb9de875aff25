"""Compression of the trained tokenizer (bytes per token, higher is better) on a few sample
texts and on documents of the train and val shards, beside GPT-2's and GPT-4's encodings
when tiktoken can load them (from its cache or the network; without either, ours only).

python -m scripts.tok_eval [--tokenizer-dir DIR] [--data-dir DIR] [--docs 256]
"""

import argparse

import tiktoken

from nanochat.cli import existing_dir, positive_int, run
from nanochat.data.shards import DatasetError, parquets_iter_batched
from nanochat.tokenizer import get_tokenizer

SAMPLES = {
    "prose": ("The river had risen overnight, and by morning the low road to the mill was under a hand's "
              "depth of brown water. Nobody in the village seemed surprised; they moved the sheep to the "
              "upper field, stacked sandbags against the bakery door, and went on with the day as if floods "
              "were simply another kind of weather, which, in that valley, they were."),
    "science": ("Photosynthesis converts light energy into chemical energy stored in glucose. In the light-"
                "dependent reactions, chlorophyll absorbs photons and water is split, releasing oxygen; the "
                "Calvin cycle then fixes carbon dioxide using ATP and NADPH produced in the first stage."),
    "code": ("def moving_average(values, window):\n"
             "    \"\"\"Mean of each run of `window` consecutive values.\"\"\"\n"
             "    if window <= 0:\n"
             "        raise ValueError(f\"window must be positive, got {window}\")\n"
             "    total = sum(values[:window])\n"
             "    out = [total / window]\n"
             "    for i in range(window, len(values)):\n"
             "        total += values[i] - values[i - window]\n"
             "        out.append(total / window)\n"
             "    return out\n"),
    "math": ("Let f(x) = 3x^2 - 12x + 7. Then f'(x) = 6x - 12 = 0 gives x = 2, and f(2) = 12 - 24 + 7 = -5, "
             "so the minimum is -5. The integral of f from 0 to 3 is [x^3 - 6x^2 + 7x] = 27 - 54 + 21 = -6."),
    "numbers": "Q3 revenue was $4,815,162.34 (up 23.42% YoY); order #20250131-0042 shipped 2025-01-31 at 14:05:09.",
    "multilingual": ("Der schnelle braune Fuchs springt über den faulen Hund. Le cœur a ses raisons que la raison "
                     "ne connaît point. 知識は力なり。 Знание — сила. 지식은 힘이다."),
}
REFERENCES = (("gpt2", "gpt2"), ("gpt4", "cl100k_base"))


def split_documents(split, n_docs, data_dir):
    docs = []
    for batch in parquets_iter_batched(split, data_dir=data_dir):
        docs += batch[:n_docs - len(docs)]
        if len(docs) >= n_docs:
            break
    return docs


def reference_encodings():
    """GPT-2 and GPT-4 encodings that tiktoken can load (from its local cache)."""
    refs = {}
    for label, name in REFERENCES:
        try:
            refs[label] = tiktoken.get_encoding(name)
        except Exception as e:  # network errors, missing cache: whatever tiktoken raises
            print(f"{label} ({name}) is not available locally ({type(e).__name__}); comparing without it")
    return refs


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m scripts.tok_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer-dir", type=existing_dir, default=None, help="default $NANOCHAT_BASE_DIR/tokenizer")
    parser.add_argument("--data-dir", type=existing_dir, default=None,
                        help="shard directory (default $NANOCHAT_BASE_DIR/base_data)")
    parser.add_argument("--docs", type=positive_int(), default=256, help="documents taken from the start of each split")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        tok = get_tokenizer(args.tokenizer_dir)
        texts = {name: [text] for name, text in SAMPLES.items()}
        for split in ("train", "val"):
            texts[f"{split} shards"] = split_documents(split, args.docs, args.data_dir)
    except (DatasetError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    refs = reference_encodings()
    encoders = {"ours": tok.encode}
    encoders.update({label: enc.encode_ordinary_batch for label, enc in refs.items()})

    results = {}
    header = f"{'text':<14}{'bytes':>10}" + "".join(f"{label + ' tok':>11}{'B/tok':>7}" for label in encoders)
    header += "".join(f"{'vs ' + label:>9}" for label in refs)
    print(f"Tokenizer: vocab {tok.get_vocab_size():,}\n{header}\n{'-' * len(header)}")
    for name, docs in texts.items():
        n_bytes = sum(len(d.encode("utf-8")) for d in docs)
        counts = {label: sum(map(len, encode(docs))) for label, encode in encoders.items()}
        results[name] = {"bytes": n_bytes, **{label: n_bytes / max(1, c) for label, c in counts.items()}}
        row = f"{name:<14}{n_bytes:>10,}" + "".join(f"{c:>11,}{n_bytes / max(1, c):>7.2f}" for c in counts.values())
        # relative token count: negative means we need fewer tokens than the reference
        row += "".join(f"{100 * (counts['ours'] - counts[label]) / max(1, counts[label]):>+8.1f}%" for label in refs)
        print(row)
    if not refs:
        print("(our tokenizer only: tiktoken could not load GPT-2/GPT-4, no network and no local cache)")
    return results


if __name__ == "__main__":
    run(main)
