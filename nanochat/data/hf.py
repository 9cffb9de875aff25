"""Any Hugging Face `datasets` source as shards: a dataset on the Hub, or local json, parquet,
text or csv files through the same builders.

The source is streamed (never downloaded whole: a prefix costs only the prefix), optionally
shuffled with a seeded buffer, and cut into our shard format: the first `val_docs` usable
documents become the pinned val shard, the rest train shards of `shard_docs` documents
(row groups of 1024), each written to a temporary file, verified and renamed. A train
document identical to a val document is dropped, so the two splits never share a text.

Resumable: after each finished shard the marker (CORPUS.json) records how many source rows
the shards hold (and, for an unshuffled stream, the library's position in it). A restarted
conversion keeps the finished shards, deletes anything after them, and continues from that
position, or streams the source again in the same seeded order and skips those rows; the
result equals an uninterrupted conversion. A lock file
refuses a second conversion into the same directory, and a directory holding another
corpus, or another conversion, is refused by name.
"""

import glob
import importlib.metadata
import os
import re
import shlex

import pyarrow.parquet as pq
from filelock import FileLock, Timeout

from nanochat.data.shards import (MARKER, ROW_GROUP_DOCS, VAL_SHARD, DatasetError, data_dir as _data_dir,
                                  describe_corpus, read_marker, shard_name, shards_in, write_marker, write_shard)

SOURCE = "hf"
SHARD_DOCS = 50 * ROW_GROUP_DOCS  # 51,200 documents, about one FineWeb-Edu shard of web text
VAL_DOCS = 10 * ROW_GROUP_DOCS  # ~10M tokens of web text: enough for base_train's default --eval-tokens
SHUFFLE_BUFFER = 10_000
LOCAL_BUILDERS = ("json", "parquet", "text", "csv")  # `datasets` builders that read --hf-data-files
LOCK = ".convert.lock"
# Everything that decides which documents land in which shard: a conversion resumes only
# with the same values, and a directory holds one of them.
IDENTITY = ("dataset", "config", "split", "data_files", "revision", "text_column", "shuffle_seed", "shuffle_buffer",
            "val_docs", "shard_docs")


def command(settings, data_dir):
    """The CLI line that makes (or resumes) this conversion."""
    args = ["--from-hf", settings["dataset"]]
    for flag, key in (("--hf-config", "config"), ("--hf-split", "split"), ("--hf-revision", "revision"),
                      ("--text-column", "text_column"), ("--max-docs", "max_docs"), ("--max-chars", "max_chars"),
                      ("--shard-docs", "shard_docs"), ("--val-docs", "val_docs"), ("--shuffle-seed", "shuffle_seed")):
        if settings.get(key) is not None:
            args += [flag, str(settings[key])]
    if settings.get("shuffle_seed") is not None:
        args += ["--shuffle-buffer", str(settings["shuffle_buffer"])]
    if settings.get("data_files"):
        args += ["--hf-data-files", *settings["data_files"]]
    return shlex.join(["python", "-m", "nanochat.dataset", *args, "--data-dir", data_dir])


def _local_patterns(name, data_files):
    """Local data files as absolute patterns (a resumed conversion may start from another
    directory), each required to match at least one file."""
    if not data_files:
        if name in LOCAL_BUILDERS:
            raise DatasetError(f"--from-hf {name} reads local files: add --hf-data-files 'PATTERN' "
                               f"(e.g. 'data/*.{name}')")
        return None
    out = []
    for pattern in data_files:
        if "://" in pattern:
            out.append(pattern)
            continue
        pattern = os.path.abspath(pattern)
        matches = glob.glob(pattern, recursive=True)
        if not matches:
            raise DatasetError(f"--hf-data-files: no file matches {pattern}")
        for path in matches:
            if os.path.isfile(path) and not os.access(path, os.R_OK):
                raise DatasetError(f"--hf-data-files: {path} is not readable (check its permissions)")
        out.append(pattern)
    return out


def _revision_of(builder):
    """The commit a Hub dataset's data files were resolved at (hf://datasets/NAME@SHA/...),
    or None for local files."""
    for files in (builder.config.data_files or {}).values():
        for url in files:
            m = re.search(r"@([0-9a-f]{40})/", str(url))
            if m:
                return m.group(1)
    return None


def _summary(error):
    """`Type: first line of the message`: the library's messages can run to pages."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _rows(stream, name):
    """The stream's rows; a failure of the source (network, a malformed file) becomes a
    DatasetError that says how to go on."""
    rows = iter(stream)
    try:
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except Exception as e:  # raised from inside `datasets`, of many types
                raise DatasetError(f"reading {name} failed ({_summary(e)}): run the same command again to resume "
                                   "from the last finished shard") from None
            yield row
    finally:
        rows.close()  # now, not at interpreter exit, where the library's readers complain


def open_stream(settings):
    """The source as an IterableDataset of rows, in the conversion's order, and the
    revision it resolved to."""
    import datasets  # imported here: a second of start-up that only conversions pay

    name = settings["dataset"]
    try:
        builder = datasets.load_dataset_builder(name, settings["config"], data_files=settings["data_files"],
                                                revision=settings["revision"])
        stream = builder.as_streaming_dataset(split=settings["split"])
    except Exception as e:  # the library raises many types (not found, offline, bad split, bad config)
        raise DatasetError(f"cannot stream {name} (config {settings['config']}, split {settings['split']}): "
                           f"{_summary(e)}. Check the name, --hf-config, --hf-split and the network "
                           "(for local files: --from-hf json|parquet|text --hf-data-files 'PATTERN')") from None
    if settings["shuffle_seed"] is not None:
        stream = stream.shuffle(seed=settings["shuffle_seed"], buffer_size=settings["shuffle_buffer"])
    return stream, settings["revision"] or _revision_of(builder)


def _claim(directory, settings):
    """The marker of a conversion to resume here, None for a fresh one; refuse a directory
    holding another corpus or another conversion."""
    marker, shards = read_marker(directory), shards_in(directory)
    if marker is None:
        if shards:
            raise DatasetError(f"{directory} holds shards without {MARKER} (FineWeb-Edu downloads): converting into "
                               "it would mix two corpora. Use another --data-dir.")
        return None
    if marker.get("source") != SOURCE:
        raise DatasetError(f"{directory} holds the {marker.get('source')!r} corpus ({MARKER}): converting into it "
                           "would mix two corpora. Use another --data-dir, or delete it first.")
    differ = [k for k in IDENTITY if settings[k] != marker.get(k) and not (k == "revision" and settings[k] is None)]
    if differ:
        raise DatasetError(f"{directory} holds another conversion, {describe_corpus(marker)}, which differs in "
                           f"{', '.join(differ)}: use another --data-dir, or delete it first.")
    return marker


def _start(directory, marker):
    """Where a conversion resumes: the counts at the last finished shard and the stream's
    position there (None when not saved). Shards written after it (a crash between a
    shard's rename and the marker update) and temporary files are deleted, so that the
    partial shard is redone from the source."""
    done = (marker or {}).get("checkpoint") or {"rows_read": 0, "train_shards": 0, "train_documents": 0,
                                                "val_documents": 0, "characters": 0,
                                                "skipped": {"empty": 0, "non_text": 0, "val_duplicate": 0}}
    keep = {shard_name(i) for i in range(done["train_shards"])}
    if done["val_documents"]:
        keep.add(shard_name(VAL_SHARD))
    shards = set(shards_in(directory))
    for name in os.listdir(directory):
        if (name in shards and name not in keep) or name.endswith(".tmp"):
            os.remove(os.path.join(directory, name))
    for name in keep:
        if not os.path.exists(os.path.join(directory, name)):
            raise DatasetError(f"{directory}/{name} is missing though {MARKER} lists it as finished: delete "
                               f"{directory} and convert again")
    counts = {k: v for k, v in done.items() if k != "stream_state"}
    return {**counts, "skipped": dict(done["skipped"])}, done.get("stream_state")


def convert(dataset, data_dir=None, config=None, split="train", data_files=None, revision=None, text_column="text",
            max_docs=None, max_chars=None, shard_docs=SHARD_DOCS, val_docs=VAL_DOCS, shuffle_seed=None,
            shuffle_buffer=SHUFFLE_BUFFER):
    """Convert (or resume converting) `dataset` into shards in `data_dir`; return the marker.
    max_docs and max_chars count the val documents too."""
    if max_docs is not None and max_docs <= val_docs:
        raise DatasetError(f"--max-docs {max_docs} leaves no train documents after the {val_docs} val documents: "
                           "raise --max-docs or lower --val-docs")
    directory = _data_dir(data_dir)
    settings = {"dataset": dataset, "config": config, "split": split, "data_files": _local_patterns(dataset, data_files),
                "revision": revision, "text_column": text_column, "shuffle_seed": shuffle_seed,
                "shuffle_buffer": shuffle_buffer if shuffle_seed is not None else None,
                "val_docs": val_docs, "shard_docs": shard_docs, "max_docs": max_docs, "max_chars": max_chars,
                "datasets_version": importlib.metadata.version("datasets")}
    os.makedirs(directory, exist_ok=True)
    lock = FileLock(os.path.join(directory, LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise DatasetError(f"another conversion is writing into {directory} (it holds {lock.lock_file}): wait for "
                           "it to finish, or use another --data-dir") from None
    try:
        marker = _claim(directory, settings)
        if marker is not None:
            settings["revision"] = settings["revision"] or marker.get("revision")  # resume the same commit
            if marker.get("complete"):
                limits = [(k, marker.get(k), settings[k]) for k in ("max_docs", "max_chars")]
                if all(old == new for _, old, new in limits):
                    print(f"{directory} already holds this conversion ({marker['documents']:,} documents)", flush=True)
                    return marker
                # A larger limit extends the corpus from its last full shard; a smaller one would not
                # give the corpus that a conversion with that limit gives.
                if any(old != new and (old is None or (new is not None and new < old)) for _, old, new in limits):
                    raise DatasetError(f"{directory} holds a complete conversion with --max-docs "
                                       f"{marker.get('max_docs')} --max-chars {marker.get('max_chars')}; a smaller "
                                       "limit needs another --data-dir")
            # The shuffle buffer's order is the library's: another version may skip other rows.
            if shuffle_seed is not None and marker.get("datasets_version") != settings["datasets_version"]:
                raise DatasetError(f"{directory} holds a shuffled conversion made with datasets "
                                   f"{marker.get('datasets_version')}, this is {settings['datasets_version']}: resume it "
                                   f"with that version (pip install datasets=={marker.get('datasets_version')}), or "
                                   "use another --data-dir")
        return _convert(directory, settings, marker)
    finally:
        lock.release()


def _convert(directory, settings, marker):
    stream, settings["revision"] = open_stream(settings)
    settings["command"] = command(settings, directory)
    state, stream_state = _start(directory, marker)
    resumed = state["rows_read"]
    # An unshuffled stream restarts at its saved position (the file and row it stopped at),
    # without reading the rows before it again. A shuffled one cannot: the library does not
    # save its buffer, so the rows are streamed again and skipped.
    shuffled = settings["shuffle_seed"] is not None
    if shuffled or marker is None or marker.get("datasets_version") != settings["datasets_version"]:
        stream_state = None  # a position saved by another version of the library is not trusted
    skip = resumed
    saved = {**state, "skipped": dict(state["skipped"])}  # the counts at the last finished shard
    if stream_state is not None:
        stream.load_state_dict(stream_state)
        skip = 0
        saved["stream_state"] = stream_state
    info = {"source": SOURCE, **settings, "rows_per_group": ROW_GROUP_DOCS}
    write_marker(directory, {**info, "complete": False, "checkpoint": saved})  # claims the directory
    name = describe_corpus(info)
    print(f"Converting {name} into {directory}"
          + (f", resuming after {resumed:,} rows ({state['train_shards']} train shards kept)" if resumed else ""),
          flush=True)

    column = settings["text_column"]
    val_path = os.path.join(directory, shard_name(VAL_SHARD))
    val, train = [], []
    val_seen = set(pq.read_table(val_path).column("text").to_pylist()) if state["val_documents"] else set()

    def finish_shard(docs, path):
        write_shard(path, docs, ROW_GROUP_DOCS)
        print(f"{os.path.basename(path)}: {len(docs):,} documents; {state['rows_read']:,} rows read, "
              f"{state['characters']:,} characters kept", flush=True)

    def checkpoint():
        saved.update(state, skipped=dict(state["skipped"]))
        if not shuffled:
            saved["stream_state"] = stream.state_dict()
        write_marker(directory, {**info, "complete": False, "checkpoint": saved})

    def limit_reached():
        kept = state["val_documents"] + state["train_documents"]
        return ((settings["max_docs"] is not None and kept >= settings["max_docs"])
                or (settings["max_chars"] is not None and state["characters"] >= settings["max_chars"]))

    rows = _rows(stream, settings["dataset"])
    for i, row in enumerate(rows):
        if i == 0 and column not in row:
            raise DatasetError(f"{settings['dataset']} has no column {column!r}; its columns: "
                               f"{', '.join(row)}. Pass --text-column NAME")
        if i < skip:  # rows the finished shards already hold
            continue
        state["rows_read"] += 1
        text = row[column]
        if not isinstance(text, str):
            state["skipped"]["non_text"] += 1
            continue
        if not text.strip():
            state["skipped"]["empty"] += 1
            continue
        if state["val_documents"] < settings["val_docs"]:
            val.append(text)
            val_seen.add(text)
            state["val_documents"] += 1
            state["characters"] += len(text)
            if state["val_documents"] == settings["val_docs"]:
                finish_shard(val, val_path)
                checkpoint()
        elif text in val_seen:
            state["skipped"]["val_duplicate"] += 1
        else:
            train.append(text)
            state["train_documents"] += 1
            state["characters"] += len(text)
            if len(train) == settings["shard_docs"]:
                finish_shard(train, os.path.join(directory, shard_name(state["train_shards"])))
                state["train_shards"] += 1
                train = []
                checkpoint()
        if limit_reached():  # checked after each kept document: no row is read past the limit
            break
    rows.close()

    if state["val_documents"] < settings["val_docs"] or (not train and not state["train_shards"]):
        raise DatasetError(f"{settings['dataset']} gave {state['val_documents'] + state['train_documents']} usable "
                           f"documents ({state['rows_read']} rows read, skipped {state['skipped']}) before the source or "
                           f"--max-chars ran out: the val shard takes {settings['val_docs']} and train needs at least "
                           "one. Lower --val-docs or raise --max-chars")
    final = dict(state)
    if train:
        finish_shard(train, os.path.join(directory, shard_name(state["train_shards"])))
        final["train_shards"] += 1
    final["documents"] = final["val_documents"] + final["train_documents"]
    marker = {**info, **final, "complete": True, "checkpoint": saved}
    write_marker(directory, marker)
    skipped = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in state["skipped"].items())
    print(f"Converted {name}: {final['train_documents']:,} train documents in {final['train_shards']} shards "
          f"+ {final['val_documents']:,} val ({shard_name(VAL_SHARD)}), {final['characters']:,} characters; "
          f"skipped {skipped}", flush=True)
    return marker
