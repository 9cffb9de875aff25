"""Corpora built from local text, written as shards in one pass: the offline corpus (the
Python installation's documentation, for machines without network) and a user's .txt,
.md or .jsonl files. Every VAL_EVERY-th document goes to the pinned val shard."""

import json
import os
import platform
import re

from nanochat.data.pydocs import collect_python_docs
from nanochat.data.shards import (MARKER, SOURCES, VAL_SHARD, DatasetError, corpus_source, data_dir as _data_dir,
                                  read_marker, shard_name, shards_in, write_marker, write_shard)

LOCAL_ROW_GROUP = 128  # local corpora are small: small row groups give every rank some
LOCAL_SHARD_CHARS = 2_000_000
VAL_EVERY = 10  # every 10th document goes to the val shard
TEXT_DOC_CHARS = 4000  # target document size when a .txt file is cut at blank lines
TEXT_SUFFIXES = (".txt", ".md", ".jsonl")
# Downloaded or converted corpora: expensive to rebuild, never replaced by a local build.
KEPT_SOURCES = (*SOURCES, "hf")


def write_corpus(docs, data_dir, info, rows_per_group=LOCAL_ROW_GROUP, shard_chars=LOCAL_SHARD_CHARS,
                 val_every=VAL_EVERY):
    """Write documents as train shards plus the val shard (every `val_every`-th document,
    starting with the first) and a marker. A new train shard starts at the first row-group
    boundary after `shard_chars` characters. Replaces a local corpus already in the
    directory; refuses to touch downloaded or converted shards. Returns the marker dict."""
    directory = _data_dir(data_dir)
    existing, source = shards_in(directory), corpus_source(directory)
    if (existing or read_marker(directory)) and source in KEPT_SOURCES:
        what = (f"downloaded {SOURCES[source].title} shards" if source in SOURCES
                else f"the {source!r} corpus ({MARKER})")
        raise DatasetError(f"{directory} holds {what}: a local corpus would mix with them. Use another --data-dir.")
    os.makedirs(directory, exist_ok=True)
    for name in existing:
        os.remove(os.path.join(directory, name))
    # Marked before writing, so that a build that fails halfway (bad input) leaves a
    # directory the next build is allowed to replace.
    write_marker(directory, dict(info, complete=False))

    val, shard, shard_len, shard_idx, n_docs, n_chars = [], [], 0, 0, 0, 0

    def flush_shard():
        if shard_idx >= VAL_SHARD:
            raise DatasetError(f"more than {VAL_SHARD} train shards: raise shard_chars")
        write_shard(os.path.join(directory, shard_name(shard_idx)), shard, rows_per_group)
        return [], 0, shard_idx + 1

    for i, doc in enumerate(docs):
        n_docs, n_chars = n_docs + 1, n_chars + len(doc)
        if i % val_every == 0:
            val.append(doc)
            continue
        shard.append(doc)
        shard_len += len(doc)
        if shard_len >= shard_chars and len(shard) % rows_per_group == 0:  # cut at a row-group boundary
            shard, shard_len, shard_idx = flush_shard()
    if shard:
        shard, shard_len, shard_idx = flush_shard()
    if shard_idx == 0 or not val:
        raise DatasetError(f"a corpus needs at least 2 documents (one train, one val); got {n_docs}")
    write_shard(os.path.join(directory, shard_name(VAL_SHARD)), val, rows_per_group)
    info = dict(info, complete=True, documents=n_docs, characters=n_chars, train_shards=shard_idx,
                train_documents=n_docs - len(val), val_documents=len(val), rows_per_group=rows_per_group)
    write_marker(directory, info)
    return info


def build_offline_corpus(data_dir=None, rows_per_group=LOCAL_ROW_GROUP, shard_chars=LOCAL_SHARD_CHARS):
    """Write the offline corpus (collect_python_docs) as shards. Deterministic for a given
    Python installation: sorted order, no timestamps."""
    directory = _data_dir(data_dir)
    docs = collect_python_docs()
    info = write_corpus(docs, directory, {"source": "offline", "python": platform.python_version()},
                        rows_per_group=rows_per_group, shard_chars=shard_chars)
    bar = "=" * 78
    print(f"{bar}\nOFFLINE CORPUS, not FineWeb-Edu or ClimbMix: {info['documents']:,} documents, "
          f"{info['characters'] / 1e6:.1f}M "
          f"characters of the Python {info['python']} documentation\n(stdlib docstrings and comments, help topics) "
          f"in {directory}.\nGood for the demo and tests; losses and CORE on it are not comparable to the paper's.\n"
          f"{bar}", flush=True)
    return info


def _paragraph_documents(text):
    """Cut a text at blank lines and join consecutive paragraphs into documents of about
    TEXT_DOC_CHARS characters, never splitting a paragraph."""
    docs, current = [], ""
    for para in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
        para = para.strip("\n")
        if not para.strip():
            continue
        if current and len(current) + 2 + len(para) > TEXT_DOC_CHARS:
            docs.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        docs.append(current)
    return docs


def _text_files(paths):
    """The input files of --from-text: files as given, directories walked in sorted order
    keeping the known suffixes."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(TEXT_SUFFIXES)]
        elif not os.path.exists(path):
            raise DatasetError(f"--from-text: {path} does not exist")
        elif not path.endswith(TEXT_SUFFIXES):
            raise DatasetError(f"--from-text: {path} is not a .txt, .md or .jsonl file")
        else:
            files.append(path)
    if not files:
        raise DatasetError(f"--from-text: no .txt, .md or .jsonl files in {' '.join(paths)}")
    return files


def text_documents(files):
    """Yield the documents of .txt/.md files (paragraph blocks of ~TEXT_DOC_CHARS
    characters) and .jsonl files (the `text` field of each line)."""
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                if not path.endswith(".jsonl"):
                    yield from _paragraph_documents(f.read())
                    continue
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DatasetError(f"{path}:{lineno}: not valid JSON ({e})") from e
                    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                        raise DatasetError(f"{path}:{lineno}: each line must be an object with a string field `text`")
                    if row["text"]:
                        yield row["text"]
        except UnicodeDecodeError as e:
            raise DatasetError(f"{path} is not UTF-8 text ({e})") from e


def build_text_corpus(paths, data_dir=None, rows_per_group=LOCAL_ROW_GROUP, shard_chars=None):
    """Write a user's text files as shards. Shards hold at least LOCAL_SHARD_CHARS
    characters, more for big inputs so that there are about 100 of them at most."""
    directory = _data_dir(data_dir)
    files = _text_files(paths)
    if shard_chars is None:
        shard_chars = max(LOCAL_SHARD_CHARS, sum(map(os.path.getsize, files)) // 100)
    info = write_corpus(text_documents(files), directory,
                        {"source": "text", "inputs": [os.path.abspath(p) for p in paths]},
                        rows_per_group=rows_per_group, shard_chars=shard_chars)
    print(f"Text corpus: {info['documents']:,} documents ({info['characters'] / 1e6:.1f}M characters) from "
          f"{len(files)} file(s): {info['train_shards']} train shards + val in {directory}", flush=True)
    return info


