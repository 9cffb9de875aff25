"""The shard format and the train/val split every corpus shares.

A data directory holds shard_00000.parquet, shard_00001.parquet, ... (train) and the pinned
val shard (never "whatever sorts last"), each with one `text` column, plus CORPUS.json, the
marker saying which corpus the directory holds (never two in one directory). The val shard
is the downloaded corpus's own (SOURCES: shard_01822 of FineWeb-Edu, shard_06542 of
ClimbMix) and shard_01822 for every corpus built here. Owns: the downloadable corpora and
their default directories, naming, writing a shard (temporary file, verified, renamed), the
marker and the one-line description of a corpus that runs record, listing and iterating
the splits, and estimating whether the train split is big enough.
"""

import json
import math
import os
import re
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from nanochat.common import base_dir



class Source(NamedTuple):
    """A corpus nanochat publishes as shards: shard_00000 ... shard_{max_shard}, the last one
    kept for validation, downloaded into $NANOCHAT_BASE_DIR/{directory} by default."""
    title: str
    url: str
    max_shard: int
    val_shard: int
    directory: str


# FineWeb-Edu: nanochat 4d8dbaf, nanochat/dataset.py (its sample-100BT repackaged, ~250M
# characters per shard, row groups of 1024 documents). ClimbMix: nanochat 92d63d4,
# nanochat/dataset.py (NVIDIA's ClimbMix repackaged, ~100 MB per shard).
HF_DATASETS = "https://huggingface.co/datasets"
SOURCES = {
    "fineweb-edu": Source("FineWeb-Edu", f"{HF_DATASETS}/karpathy/fineweb-edu-100b-shuffle/resolve/main",
                          max_shard=1822, val_shard=1822, directory="base_data"),
    "climbmix": Source("ClimbMix", f"{HF_DATASETS}/karpathy/climbmix-400b-shuffle/resolve/main",
                       max_shard=6542, val_shard=6542, directory="base_data_climbmix"),
}
CORPORA = tuple(SOURCES)
DEFAULT_CORPUS = "fineweb-edu"  # the default trunk's (nanochat/trunks.py FLAG_DEFAULTS)
# FineWeb-Edu's layout, which every corpus built here (local, converted) shares.
MAX_SHARD = SOURCES["fineweb-edu"].max_shard
VAL_SHARD = SOURCES["fineweb-edu"].val_shard
ROW_GROUP_DOCS = 1024
FINEWEB_CHARS_PER_SHARD = 250_000_000
# Sizing estimates: ~4.8 characters per token for a 32K vocab on FineWeb-Edu, and best-fit
# packing at T=2048 keeps ~65% of the tokens it reads (nanochat dev/LOG: 34.6% cropped).
CHARS_PER_TOKEN = 4.8
KEPT_FRACTION = 0.65

MARKER = "CORPUS.json"  # which corpus a data dir holds; never mix two in one dir
SHARD_RE = re.compile(r"shard_(\d{5})\.parquet")


class DatasetError(RuntimeError):
    """Missing, corrupt or insufficient data, or a failed download; the message names the fix."""


def shard_name(index):
    return f"shard_{index:05d}.parquet"


def check_corpus(corpus):
    """The corpus name, or ValueError naming the choices."""
    if corpus not in SOURCES:
        raise ValueError(f"corpus={corpus!r}; choose one of {', '.join(CORPORA)}")
    return corpus


def data_dir(base=None, corpus=DEFAULT_CORPUS):
    """The shard directory: `base` when given (e.g. --data-dir), else the corpus's own under
    base_dir() (base_data for FineWeb-Edu, base_data_climbmix for ClimbMix)."""
    if base:
        return os.path.abspath(base)
    return os.path.join(base_dir(), SOURCES[check_corpus(corpus)].directory)


_data_dir = data_dir  # reachable inside functions whose `data_dir` parameter shadows it


def read_marker(directory):
    path = os.path.join(directory, MARKER)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_marker(directory, marker):
    """Write the marker through a temporary file and a rename: a reader (or a process
    killed mid-write) sees the old marker or the new one, never half of one."""
    path = os.path.join(directory, MARKER)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(marker, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def corpus_source(directory):
    """The marker's `source`. Shards without a marker were downloaded before the marker
    existed, or by nanochat itself: ClimbMix when its val shard is there, else FineWeb-Edu."""
    marker = read_marker(directory)
    if marker is not None:
        return marker.get("source", "fineweb-edu")
    climbmix_val = os.path.join(directory, shard_name(SOURCES["climbmix"].val_shard))
    return "climbmix" if os.path.exists(climbmix_val) else "fineweb-edu"


def val_shard(directory):
    """The index of the directory's pinned val shard."""
    source = corpus_source(directory)
    return SOURCES[source].val_shard if source in SOURCES else VAL_SHARD


def describe_corpus(marker):
    """One line naming the corpus a marker describes, e.g. `HuggingFaceFW/fineweb (config
    sample-10BT, split train, revision 1a2b3c4d5e6f)`; None is FineWeb-Edu (see corpus_source)."""
    marker = marker or {"source": "fineweb-edu"}
    source = marker.get("source")
    if source == "fineweb-edu":
        return "FineWeb-Edu (nanochat's shards, as in the paper)"
    if source == "climbmix":
        return "ClimbMix (nanochat's shards, as nanochat trains since March 2026)"
    if source == "offline":
        return f"the offline corpus (Python {marker.get('python', '?')} documentation; not comparable to the paper)"
    if source == "text":
        return "local text files (" + " ".join(marker.get("inputs", [])) + ")"
    if source != "hf":
        return repr(source)
    parts = [f"config {marker['config']}"] if marker.get("config") else []
    parts.append(f"split {marker.get('split') or 'train'}")
    if marker.get("data_files"):
        parts.append("files " + " ".join(marker["data_files"]))
    if marker.get("revision"):
        parts.append(f"revision {marker['revision'][:12]}")
    if marker.get("shuffle_seed") is not None:
        parts.append(f"shuffled (seed {marker['shuffle_seed']}, buffer {marker['shuffle_buffer']:,})")
    if marker.get("documents"):
        parts.append(f"{marker['documents']:,} documents")
    return f"{marker.get('dataset')} ({', '.join(parts)})"


def corpus_record(data_dir=None, corpus=DEFAULT_CORPUS):
    """What a run trains on, for its run directory: the data dir (`data_dir`, else the
    corpus's default one), the corpus (its source: a SOURCES name, or offline, text, hf...),
    its marker (without the conversion's resume state) and the one-line description."""
    directory = _data_dir(data_dir, corpus)
    marker = read_marker(directory) or {"source": corpus_source(directory)}
    marker = {k: v for k, v in marker.items() if k != "checkpoint"}
    return {"data_dir": directory, "corpus": marker.get("source"), "description": describe_corpus(marker),
            "marker": marker}


def check_tokenizer_corpus(record, tokenizer_dir):
    """Refuse (DatasetError, one line) to train on one downloaded corpus with a tokenizer
    trained on the other: its merges and bits per byte belong to that text. `record` is the
    run's corpus_record; a tokenizer that names no corpus was trained on FineWeb-Edu."""
    from nanochat.tokenizer import CONFIG_FILE
    with open(os.path.join(tokenizer_dir, CONFIG_FILE)) as f:
        trained_on = json.load(f).get("info", {}).get("source", "fineweb-edu")
    if trained_on in SOURCES and record["corpus"] in SOURCES and trained_on != record["corpus"]:
        raise DatasetError(f"the tokenizer in {tokenizer_dir} was trained on {SOURCES[trained_on].title}, the run "
                           f"reads {SOURCES[record['corpus']].title}; train one on it: "
                           f"`python -m scripts.tok_train{dir_flag(record['data_dir'], record['corpus'])}`")


def shards_in(directory):
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if SHARD_RE.fullmatch(f))


def _default_corpus(directory):
    """The corpus whose default directory this is, else the default corpus."""
    return next((c for c in CORPORA if directory == _data_dir(corpus=c)), DEFAULT_CORPUS)


def dir_flag(directory, corpus=None):
    """The --corpus and --data-dir part of a suggested command for `corpus` (default: the one
    whose default directory this is): --corpus unless it is the default corpus, --data-dir
    unless the directory is that corpus's default one."""
    corpus = corpus or _default_corpus(directory)
    flag = "" if corpus == DEFAULT_CORPUS else f" --corpus {corpus}"
    return flag + ("" if directory == _data_dir(corpus=corpus) else f" --data-dir {directory}")


def download_corpus(directory):
    """The corpus a download into this directory fetches: the one there, else the one whose
    default directory this is."""
    source = corpus_source(directory)
    if source in SOURCES and (read_marker(directory) is not None or shards_in(directory)):
        return source
    return _default_corpus(directory)


def fix_hint(directory):
    """The command that (re)creates this directory's corpus."""
    flag = dir_flag(directory)
    marker = read_marker(directory) or {}
    if marker.get("command"):
        return f"`{marker['command']}`"
    if marker.get("source") == "offline":
        return f"`python -m nanochat.dataset --offline{flag}`"
    if marker.get("source") == "text":
        return f"`python -m nanochat.dataset --from-text {' '.join(marker.get('inputs', ['PATH']))}{flag}`"
    corpus = download_corpus(directory)
    n = max(1, len([s for s in shards_in(directory) if s != shard_name(val_shard(directory))]))
    return f"`python -m nanochat.dataset -n {n}{dir_flag(directory, corpus)}` (or `--offline` without network)"


def verify_shard(path, full=False):
    """Open the parquet file and check its `text` column; `full` also decodes every row
    group (used right after a download or a write). Returns the number of documents."""
    try:
        pf = pq.ParquetFile(path)
        if "text" not in pf.schema_arrow.names:
            raise DatasetError(f"{path} has no `text` column (columns: {pf.schema_arrow.names})")
        if full:
            for rg in range(pf.num_row_groups):
                pf.read_row_group(rg, columns=["text"])
        return pf.metadata.num_rows
    except DatasetError:
        raise
    except Exception as e:  # pyarrow raises several types for truncated or garbled files
        raise DatasetError(f"{path} is not a readable parquet shard ({type(e).__name__}: {e})") from e


def write_shard(path, docs, rows_per_group=ROW_GROUP_DOCS):
    """Write `docs` as one shard: a temporary file, read back in full, then renamed into
    place, so that a shard on disk is always complete."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        # zstd level 3, no dictionary, no statistics: the layout of nanochat's FineWeb-Edu shards
        pq.write_table(pa.table({"text": pa.array(docs, type=pa.string())}), tmp, row_group_size=rows_per_group,
                       compression="zstd", compression_level=3, use_dictionary=False, write_statistics=False)
        if verify_shard(tmp, full=True) != len(docs):
            raise DatasetError(f"{tmp} does not hold the {len(docs)} documents just written")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ----------------------------------------------------------------------------- listing

def list_parquet_files(split, data_dir=None):
    """Paths of the split's shards, in order: train = every shard but the pinned val one,
    val = shard_01822.parquet. Every file's footer is checked, so a corrupt shard fails
    here with the command to fix it rather than deep inside training."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    directory = _data_dir(data_dir)
    names = shards_in(directory)
    marker = read_marker(directory)
    if marker is not None and marker.get("complete") is False:
        raise DatasetError(f"{directory} holds an unfinished build: run {fix_hint(directory)}")
    if not names and marker is not None:
        raise DatasetError(f"no shards in {directory} (an unfinished build?): run {fix_hint(directory)}")
    if not names:
        corpus = download_corpus(directory)
        flag = dir_flag(directory, corpus)
        raise DatasetError(f"no shards in {directory}: run `python -m nanochat.dataset -n 8{flag}` "
                           f"({SOURCES[corpus].title}), or `python -m nanochat.dataset --offline{flag}` "
                           "without network")
    val = shard_name(val_shard(directory))
    files = [val] if split == "val" else [n for n in names if n != val]
    if split == "val" and val not in names:
        raise DatasetError(f"the pinned val shard {val} is missing from {directory}: run {fix_hint(directory)}")
    if not files:
        raise DatasetError(f"{directory} holds no train shards (only {val}): run {fix_hint(directory)}")
    paths = [os.path.join(directory, n) for n in files]
    for path in paths:
        try:
            verify_shard(path)
        except DatasetError as e:
            raise DatasetError(f"corrupt shard: {e}. Delete it and run {fix_hint(directory)}") from e
    return paths


def parquets_iter_batched(split, start=0, step=1, data_dir=None):
    """Yield the list of texts of every `step`-th row group from `start`, file by file."""
    for path in list_parquet_files(split, data_dir):
        pf = pq.ParquetFile(path)
        for rg in range(start, pf.num_row_groups, step):
            yield pf.read_row_group(rg, columns=["text"]).column("text").to_pylist()


def split_stats(split, data_dir=None):
    """Files, row groups, documents and text bytes of a split, from parquet metadata alone.
    text_bytes is the uncompressed size of the `text` column minus the 4-byte length of
    each value: close to the UTF-8 size of the text for shards in our layout (plain
    encoding, no statistics), an estimate read without decoding any data."""
    stats = {"files": 0, "row_groups": 0, "docs": 0, "text_bytes": 0}
    for path in list_parquet_files(split, data_dir):
        meta = pq.ParquetFile(path).metadata
        col = meta.schema.names.index("text")
        stats["files"] += 1
        stats["row_groups"] += meta.num_row_groups
        stats["docs"] += meta.num_rows
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            stats["text_bytes"] += group.column(col).total_uncompressed_size - 4 * group.num_rows
    return stats


def check_enough_data(tokens_needed, data_dir=None, chars_per_token=CHARS_PER_TOKEN, kept_fraction=KEPT_FRACTION):
    """Raise DatasetError when the local train split is too small for `tokens_needed`
    training tokens, naming the command that would fix it. The token count is an
    estimate: text bytes / chars_per_token, times the fraction best-fit packing keeps.
    Returns split_stats plus the estimate when there is enough."""
    directory = _data_dir(data_dir)
    stats = split_stats("train", directory)
    usable = int(stats["text_bytes"] / chars_per_token * kept_fraction)
    stats["usable_tokens_estimate"] = usable
    if tokens_needed <= usable:
        return stats
    how = (f"estimate: {stats['text_bytes']:,} bytes of text / {chars_per_token} chars per token "
           f"x {kept_fraction} kept by best-fit packing")
    source = corpus_source(directory)
    msg = (f"the train split in {directory} ({stats['files']} shards) holds about {usable:,} usable tokens "
           f"({how}), but the run needs {tokens_needed:,}")
    if source == "hf":
        raise DatasetError(f"{msg}. Train for fewer iterations, or convert more of the dataset (raise --max-docs "
                           f"or --max-chars of {fix_hint(directory)}) into another --data-dir.")
    if source not in SOURCES:
        raise DatasetError(f"{msg}. It is the local {source!r} corpus: train for fewer iterations, or download "
                           "FineWeb-Edu shards into another --data-dir (`python -m nanochat.dataset -n N`).")
    per_shard = stats["text_bytes"] / stats["files"] if stats["files"] else FINEWEB_CHARS_PER_SHARD
    n = math.ceil(tokens_needed * chars_per_token / kept_fraction / per_shard)
    if n > SOURCES[source].max_shard:
        raise DatasetError(f"{msg}; even all {SOURCES[source].max_shard} train shards would not be enough: "
                           "train for fewer iterations.")
    raise DatasetError(f"{msg}. Download more: `python -m nanochat.dataset -n {n}{dir_flag(directory, source)}`")
