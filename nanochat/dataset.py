"""The data CLI: fill a data directory with shards (the work is in nanochat/data/).

python -m nanochat.dataset [--corpus fineweb-edu|climbmix] -n N [-w W] [--base-url URL] [--data-dir DIR]
python -m nanochat.dataset [--corpus C] --offline | --offline-fallback -n N | --from-text PATH...
python -m nanochat.dataset --from-hf NAME [--hf-config C] [--hf-split S] [--hf-data-files P...]
       [--text-column text] [--max-docs N | --max-chars N] [--shard-docs D] [--val-docs V]
       [--shuffle-seed S [--shuffle-buffer B]] [--data-dir DIR]                 any `datasets` source

--corpus picks the corpus downloaded (FineWeb-Edu, the 2026-01 trunk's, by default; ClimbMix,
the 2026-07 trunk's) and the default directory of every mode: $NANOCHAT_BASE_DIR/base_data or
base_data_climbmix, where a run with that --corpus and no --data-dir reads.
"""

import argparse
import os

from nanochat.cli import int_at_least, int_in, nonneg_int, positive_int, run
from nanochat.data import hf
from nanochat.data.download import download, source_reachable, source_url, wanted_shards
from nanochat.data.local import build_offline_corpus, build_text_corpus
from nanochat.data.shards import (CORPORA, DEFAULT_CORPUS, SOURCES, DatasetError, data_dir as _data_dir, read_marker,
                                  shard_name, shards_in)

HF_FLAGS = ("hf_config", "hf_split", "hf_data_files", "hf_revision", "text_column", "max_docs", "max_chars",
            "shard_docs", "val_docs", "shuffle_seed", "shuffle_buffer")


def offline_fallback(num_files, data_dir=None, workers=4, base_url=None, corpus=DEFAULT_CORPUS):
    """Real shards of `corpus` when its source answers, the offline corpus when it does not.
    A directory that already holds a local corpus, or every requested shard, is used as is."""
    directory, title, url = _data_dir(data_dir, corpus), SOURCES[corpus].title, source_url(base_url, corpus)
    marker = read_marker(directory)
    if marker is not None and marker.get("source") in ("offline", "text", hf.SOURCE):
        print(f"Using the {marker['source']} corpus already in {directory} (delete it to download {title})")
        return
    present = shards_in(directory)
    wanted = set(map(shard_name, wanted_shards(num_files, corpus)))
    if wanted <= set(present) or source_reachable(base_url, corpus=corpus):
        download(num_files, directory, workers=workers, base_url=base_url, corpus=corpus)  # no request if all present
        return
    if present:
        raise DatasetError(f"{url} is unreachable and {directory} holds only part of the requested {title} shards: "
                           "retry with network, or use --offline with another --data-dir")
    print(f"{url} is unreachable: building the offline corpus instead", flush=True)
    build_offline_corpus(directory)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m nanochat.dataset",
        description="Download FineWeb-Edu or ClimbMix shards (train 0..N-1 plus the corpus's pinned val shard, "
                    "01822 or 06542), or build a corpus in the same format from local text or from any Hugging Face "
                    "`datasets` source.")
    largest = max(source.max_shard for source in SOURCES.values())
    parser.add_argument("--corpus", choices=CORPORA, default=DEFAULT_CORPUS,
                        help="the corpus to download, and whose default directory every mode fills "
                             "(default fineweb-edu: base_data; climbmix: base_data_climbmix)")
    parser.add_argument("-n", "--num-files", type=int_in(1, largest, {0: "only the val shard", -1: "all of them"}),
                        default=-1, help=", ".join(f"{s.title} has 1..{s.max_shard}" for s in SOURCES.values())
                        + " train shards; 0 means only the val shard (which always comes too), -1 means all "
                          "of them (default)")
    parser.add_argument("-w", "--num-workers", type=positive_int(), default=4, help="parallel downloads (>= 1)")
    parser.add_argument("--base-url", default=None,
                        help="shard source (default $NANOCHAT_DATA_URL, else the corpus's own on Hugging Face)")
    parser.add_argument("--data-dir", default=None,
                        help="shard directory (default the corpus's: $NANOCHAT_BASE_DIR/base_data or base_data_climbmix)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--offline", action="store_true",
                      help="build the offline corpus from the Python installation's documentation (no network)")
    mode.add_argument("--offline-fallback", action="store_true",
                      help="probe the source once (5 s); download when it answers, else build the offline corpus")
    mode.add_argument("--from-text", nargs="+", metavar="PATH",
                      help=".txt/.md files (cut into ~4000-character blocks at blank lines), .jsonl files "
                           "(field `text`, one document per line), or directories of them")
    mode.add_argument("--from-hf", metavar="NAME",
                      help="stream a Hugging Face dataset (e.g. HuggingFaceFW/fineweb) into shards; a builder name "
                           f"({', '.join(hf.LOCAL_BUILDERS)}) reads local --hf-data-files the same way")
    conv = parser.add_argument_group("--from-hf options")
    conv.add_argument("--hf-config", default=None, help="dataset configuration (subset), e.g. sample-10BT")
    conv.add_argument("--hf-split", default=None, help="split to read (default train)")
    conv.add_argument("--hf-data-files", nargs="+", metavar="PATTERN",
                      help="local files or glob patterns for the json (.jsonl too), parquet, text (one document per "
                           "line) or csv builders")
    conv.add_argument("--hf-revision", default=None, help="Hub commit, branch or tag (default: the latest commit, "
                                                          "recorded in the manifest)")
    conv.add_argument("--text-column", default=None, help="column holding the documents (default text)")
    limit = conv.add_mutually_exclusive_group()
    limit.add_argument("--max-docs", type=int_at_least(2), default=None,
                       help="stop after this many documents, val included (default: the whole split)")
    limit.add_argument("--max-chars", type=positive_int(), default=None,
                       help="stop once this many characters are kept, val included; 2e9 works")
    conv.add_argument("--shard-docs", type=positive_int(), default=None,
                      help=f"documents per train shard (default {hf.SHARD_DOCS:,}, written in row groups of 1024)")
    conv.add_argument("--val-docs", type=positive_int(), default=None,
                      help=f"documents in the pinned val shard, the first of the stream (default {hf.VAL_DOCS:,})")
    conv.add_argument("--shuffle-seed", type=nonneg_int(), default=None,
                      help="shuffle the stream with this seed (0 is a valid seed; default: source order)")
    conv.add_argument("--shuffle-buffer", type=positive_int(), default=None,
                      help=f"documents in the shuffle buffer (default {hf.SHUFFLE_BUFFER:,})")
    return parser


def _check_args(parser, args):
    if args.data_dir is not None:
        existing = os.path.abspath(args.data_dir)
        while not os.path.exists(existing):  # the directory is made later: check what holds it
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            parser.error(f"--data-dir {args.data_dir}: {existing} is a file, not a directory: pass another path")
        if not os.access(existing, os.R_OK | os.W_OK | os.X_OK):
            parser.error(f"--data-dir {args.data_dir}: {existing} is not writable: fix its permissions or pass another")
    if args.from_hf is None:
        given = [f"--{k.replace('_', '-')}" for k in HF_FLAGS if getattr(args, k) is not None]
        if given:
            parser.error(f"{', '.join(given)}: options of --from-hf NAME; add it, or drop them")
    elif args.shuffle_buffer is not None and args.shuffle_seed is None:
        parser.error("--shuffle-buffer needs --shuffle-seed S (without a seed the stream is not shuffled)")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    directory = _data_dir(args.data_dir, args.corpus)
    try:
        if args.offline:
            build_offline_corpus(directory)
        elif args.from_text:
            build_text_corpus(args.from_text, directory)
        elif args.from_hf:
            given = {"config": args.hf_config, "split": args.hf_split, "data_files": args.hf_data_files,
                     "revision": args.hf_revision, "text_column": args.text_column, "max_docs": args.max_docs,
                     "max_chars": args.max_chars, "shard_docs": args.shard_docs, "val_docs": args.val_docs,
                     "shuffle_seed": args.shuffle_seed, "shuffle_buffer": args.shuffle_buffer}
            hf.convert(args.from_hf, directory, **{k: v for k, v in given.items() if v is not None})
        elif args.offline_fallback:
            offline_fallback(args.num_files, directory, args.num_workers, args.base_url, corpus=args.corpus)
        else:
            download(args.num_files, directory, args.num_workers, args.base_url, corpus=args.corpus)
    except (DatasetError, ValueError, OSError) as e:  # OSError: e.g. the disk filled up
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    run(main)
