"""The shard format and the train/val split every corpus shares.

A data directory holds shard_00000.parquet, shard_00001.parquet, ... (train) and the pinned
val shard shard_01822.parquet (never "whatever sorts last"), each with one `text` column,
plus CORPUS.json, the marker saying which corpus the directory holds (never two in one
directory). Owns: naming, writing a shard (temporary file, verified, renamed), the marker
and the one-line description of a corpus that runs record, listing and iterating the
splits, and estimating whether the train split is big enough.
"""

import json
import math
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq

from nanochat.common import base_dir

# nanochat's FineWeb-Edu layout (source: nanochat/dataset.py): shard_00000 ... shard_01822,
# ~250M characters each, row groups of 1024 documents, the last shard kept for validation.
MAX_SHARD = 1822
VAL_SHARD = MAX_SHARD
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


def data_dir(base=None):
    """The shard directory: `base` when given (e.g. --data-dir), else base_dir()/base_data."""
    return os.path.abspath(base) if base else os.path.join(base_dir(), "base_data")


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
    """The marker's `source`; shards without a marker are FineWeb-Edu (downloads from before
    the marker existed)."""
    return (read_marker(directory) or {}).get("source", "fineweb-edu")


def describe_corpus(marker):
    """One line naming the corpus a marker describes, e.g. `HuggingFaceFW/fineweb (config
    sample-10BT, split train, revision 1a2b3c4d5e6f)`; None is FineWeb-Edu (see corpus_source)."""
    marker = marker or {"source": "fineweb-edu"}
    source = marker.get("source")
    if source == "fineweb-edu":
        return "FineWeb-Edu (nanochat's shards, as in the paper)"
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


def corpus_record(data_dir=None):
    """What a run trains on, for its run directory: the data dir, its marker (without the
    conversion's resume state) and the one-line description."""
    directory = _data_dir(data_dir)
    marker = {k: v for k, v in (read_marker(directory) or {"source": "fineweb-edu"}).items() if k != "checkpoint"}
    return {"data_dir": directory, "description": describe_corpus(marker), "marker": marker}


def shards_in(directory):
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if SHARD_RE.fullmatch(f))


def dir_flag(directory):
    """The --data-dir part of a suggested command (none for the default directory)."""
    return "" if directory == _data_dir() else f" --data-dir {directory}"


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
    n = max(1, len([s for s in shards_in(directory) if s != shard_name(VAL_SHARD)]))
    return f"`python -m nanochat.dataset -n {n}{flag}` (or `--offline` without network)"


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
        flag = dir_flag(directory)
        raise DatasetError(f"no shards in {directory}: run `python -m nanochat.dataset -n 8{flag}` (FineWeb-Edu), "
                           f"or `python -m nanochat.dataset --offline{flag}` without network")
    val = shard_name(VAL_SHARD)
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
    if source != "fineweb-edu":
        raise DatasetError(f"{msg}. It is the local {source!r} corpus: train for fewer iterations, or download "
                           "FineWeb-Edu shards into another --data-dir (`python -m nanochat.dataset -n N`).")
    per_shard = stats["text_bytes"] / stats["files"] if stats["files"] else FINEWEB_CHARS_PER_SHARD
    n = math.ceil(tokens_needed * chars_per_token / kept_fraction / per_shard)
    if n > MAX_SHARD:
        raise DatasetError(f"{msg}; even all {MAX_SHARD} train shards would not be enough: train for fewer iterations.")
    raise DatasetError(f"{msg}. Download more: `python -m nanochat.dataset -n {n}{dir_flag(directory)}`")
