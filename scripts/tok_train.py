"""Train the BPE tokenizer on the start of the train split and save it, with its
token-byte table, into $NANOCHAT_BASE_DIR/tokenizer (or --tokenizer-dir).

python -m scripts.tok_train [--corpus fineweb-edu|climbmix] [--vocab-size 32768] [--max-chars 2e9]
                            [--doc-cap 10000] [--data-dir DIR] [--tokenizer-dir DIR]

The tokenizer trains on the corpus a run will read: --corpus picks its default directory
(base_data or base_data_climbmix), --data-dir any other. tokenizer.json records the corpus
(`info.source`), and base_train refuses to train on one downloaded corpus with a tokenizer
trained on the other.
"""

import argparse
import time

from nanochat.cli import existing_dir, int_at_least, positive_int, run
from nanochat.data.shards import (CORPORA, DEFAULT_CORPUS, DatasetError, corpus_record, data_dir, list_parquet_files,
                                  parquets_iter_batched)
from nanochat.tokenizer import SPECIAL_TOKENS, Tokenizer, default_tokenizer_dir

# Exercises what a tokenizer most often gets wrong: specials written as text, multi-byte
# characters split across tokens, long digit runs, tabs, CRLF and runs of spaces.
ROUND_TRIP_TEXT = ("Plain text <|bos|> with a special token written out, and <|assistant_end|> too.\n"
                   "Numbers 3.14159, 1234567890 and 2025-01-31; symbols ~!@#$%^&*()_+{}|:\"<>?\n"
                   "\tdef f(x):\r\n        return x ** 2  # comment\n\n\n"
                   "Accents: café, naïve, Zürich; Greek αβγ; CJK 漢字かな한글; emoji 🚀👍🏽; ZWJ 👩‍💻.\n")


def text_iterator(data_directory, max_chars, doc_cap, counts):
    """Train documents in order, each cut to doc_cap characters, until max_chars."""
    for batch in parquets_iter_batched("train", data_dir=data_directory):
        for doc in batch:
            doc = doc[:doc_cap]
            counts["docs"] += 1
            counts["chars"] += len(doc)
            yield doc
            if counts["chars"] >= max_chars:
                return


def check_round_trip(tok):
    ids = tok.encode(ROUND_TRIP_TEXT, prepend="<|bos|>", append="<|output_end|>")
    if tok.decode(ids) != "<|bos|>" + ROUND_TRIP_TEXT + "<|output_end|>":
        raise SystemExit("error: the trained tokenizer fails the encode/decode round trip")
    if [tok.encode_special(name) for name in SPECIAL_TOKENS] != list(range(tok.get_vocab_size() - len(SPECIAL_TOKENS),
                                                                             tok.get_vocab_size())):
        raise SystemExit("error: the trained tokenizer's special tokens are not on the last ids")
    return len(ids)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m scripts.tok_train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int_at_least(256 + len(SPECIAL_TOKENS) + 1), default=32768,
                        help=f"vocabulary size, the {len(SPECIAL_TOKENS)} special tokens included (more than "
                             f"256 bytes + {len(SPECIAL_TOKENS)} specials)")
    parser.add_argument("--max-chars", type=positive_int(), default=2_000_000_000,
                        help="train on the first this many characters of the train split (2e9 style accepted)")
    parser.add_argument("--doc-cap", type=positive_int(), default=10_000, help="characters kept from each document")
    parser.add_argument("--corpus", choices=CORPORA, default=DEFAULT_CORPUS,
                        help="train on this corpus's default directory (fineweb-edu: $NANOCHAT_BASE_DIR/base_data, "
                             "climbmix: base_data_climbmix); the run's --corpus must match it")
    parser.add_argument("--data-dir", type=existing_dir, default=None,
                        help="shard directory (default the --corpus's)")
    parser.add_argument("--tokenizer-dir", default=None, help="output (default the --corpus's: $NANOCHAT_BASE_DIR/tokenizer for "
                             "fineweb-edu, tokenizer_climbmix for climbmix)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    directory = data_dir(args.data_dir, args.corpus)
    out = args.tokenizer_dir or default_tokenizer_dir(args.corpus)
    try:
        list_parquet_files("train", directory)  # fail on missing data before anything else
        corpus = corpus_record(directory)
        source = corpus["corpus"]
        print(f"Training a {args.vocab_size}-token BPE on up to {args.max_chars:,} characters of the train split of "
              f"{corpus['description']} in {directory} (documents cut at {args.doc_cap:,})", flush=True)
        counts = {"docs": 0, "chars": 0}
        t0 = time.time()
        tok = Tokenizer.train_from_iterator(text_iterator(directory, args.max_chars, args.doc_cap, counts),
                                            args.vocab_size)
    except (DatasetError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    train_time = time.time() - t0
    if tok.get_vocab_size() < args.vocab_size:
        print(f"warning: the text ran out of pairs to merge: vocab is {tok.get_vocab_size()}, not {args.vocab_size}; "
              "give the model this vocab_size (read it from the tokenizer)")
    n_ids = check_round_trip(tok)
    info = {"data_dir": directory, "source": source, "corpus": corpus["description"], "docs": counts["docs"],
            "chars": counts["chars"], "max_chars": args.max_chars, "doc_cap": args.doc_cap,
            "requested_vocab_size": args.vocab_size}
    tok.save(out, info=info)
    if Tokenizer.from_directory(out).encode(ROUND_TRIP_TEXT) != tok.encode(ROUND_TRIP_TEXT):
        raise SystemExit(f"error: the tokenizer saved in {out} does not load back identically")

    lengths = [n for n in tok.token_byte_lengths() if n > 0]
    partial = sum(1 for i in range(len(lengths)) if not _valid_utf8(tok.id_to_bytes(i)))
    print(f"Trained in {train_time:.1f}s on {counts['docs']:,} documents, {counts['chars']:,} characters")
    print(f"Vocab {tok.get_vocab_size():,} = 256 bytes + {len(lengths) - 256:,} merges + {len(SPECIAL_TOKENS)} "
          f"specials; <|bos|> = {tok.get_bos_token_id()}")
    print(f"Token bytes: min {min(lengths)}, mean {sum(lengths) / len(lengths):.2f}, max {max(lengths)}; "
          f"{partial} tokens are not valid UTF-8 alone (counted by their raw bytes)")
    print(f"Round trip OK ({n_ids} ids). Saved tokenizer.bpe, tokenizer.json, token_bytes.pt in {out}")
    return tok


def _valid_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


if __name__ == "__main__":
    run(main)
