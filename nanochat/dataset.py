"""The pretraining text on local disk, as parquet shards with one `text` column.

Owns: downloading nanochat's FineWeb-Edu shards (parallel, retried with backoff, one lock
per shard, written to a temporary file and renamed, verified before use); listing the
train and val splits (val is the pinned shard_01822.parquet, never "whatever sorts last");
iterating row groups; estimating whether the train split is big enough for a run; and
building local corpora in the same format: the offline corpus (the Python installation's
own documentation, for machines without network) and a user's text or jsonl files.

CLI: python -m nanochat.dataset -n N [-w W] [--base-url URL] [--data-dir DIR]
     python -m nanochat.dataset --offline | --offline-fallback -n N | --from-text PATH...
"""

import argparse
import ast
import importlib
import importlib.machinery
import importlib.util
import inspect
import io
import json
import math
import os
import platform
import re
import sys
import sysconfig
import tempfile
import time
import tokenize
import warnings
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import requests
from filelock import FileLock

from nanochat.common import base_dir

# nanochat's repackaged FineWeb-Edu sample-100BT (source: nanochat/dataset.py):
# shard_00000.parquet ... shard_01822.parquet, ~250M characters each, row groups of 1024 docs.
BASE_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
MAX_SHARD = 1822
VAL_SHARD = MAX_SHARD
FINEWEB_CHARS_PER_SHARD = 250_000_000
# Sizing estimates: ~4.8 characters per token for a 32K vocab on FineWeb-Edu, and best-fit
# packing at T=2048 keeps ~65% of the tokens it reads (nanochat dev/LOG: 34.6% cropped).
CHARS_PER_TOKEN = 4.8
KEPT_FRACTION = 0.65

MARKER = "CORPUS.json"  # which corpus a data dir holds; never mix two in one dir
SHARD_RE = re.compile(r"shard_(\d{5})\.parquet")
LOCAL_ROW_GROUP = 128  # local corpora are small: small row groups give every rank some
LOCAL_SHARD_CHARS = 2_000_000
VAL_EVERY = 10  # local corpora: every 10th document goes to the val shard
TEXT_DOC_CHARS = 4000  # target document size when a .txt file is cut at blank lines
TEXT_SUFFIXES = (".txt", ".md", ".jsonl")


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


def _write_json(path, obj):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _shards_in(directory):
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if SHARD_RE.fullmatch(f))


def _dir_flag(directory):
    """The --data-dir part of a suggested command (none for the default directory)."""
    return "" if directory == _data_dir() else f" --data-dir {directory}"


def _fix_hint(directory):
    """The command that (re)creates this directory's corpus."""
    flag = _dir_flag(directory)
    marker = read_marker(directory) or {}
    if marker.get("source") == "offline":
        return f"`python -m nanochat.dataset --offline{flag}`"
    if marker.get("source") == "text":
        return f"`python -m nanochat.dataset --from-text {' '.join(marker.get('inputs', ['PATH']))}{flag}`"
    n = max(1, len([s for s in _shards_in(directory) if s != shard_name(VAL_SHARD)]))
    return f"`python -m nanochat.dataset -n {n}{flag}` (or `--offline` without network)"


def verify_shard(path, full=False):
    """Open the parquet file and check its `text` column; `full` also decodes every row
    group (used right after a download). Returns the number of documents."""
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


# ---------------------------------------------------------------------------- download

def source_url(base_url=None):
    return (base_url or os.environ.get("NANOCHAT_DATA_URL") or BASE_URL).rstrip("/")


def _fetch(url, path, timeout):
    """One attempt: stream into a private temporary file, verify, rename into place."""
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f, requests.get(url, stream=True, timeout=timeout) as r:
            if r.status_code == 404:
                raise FileNotFoundError(f"{url} does not exist (HTTP 404)")
            r.raise_for_status()
            for chunk in r.iter_content(chunk_size=1 << 20):
                f.write(chunk)
        verify_shard(tmp, full=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def download_shard(index, directory, base_url=None, attempts=5, backoff=2.0, timeout=30):
    """Make shard `index` present and valid in `directory`; return its path.

    A lock per shard serializes concurrent processes or ranks: the second one waits, then
    finds the verified file and returns. A corrupt file already on disk is deleted and
    fetched again. Attempt k (from 0) failing waits backoff * 2**k seconds."""
    name = shard_name(index)
    path = os.path.join(directory, name)
    url = f"{source_url(base_url)}/{name}"
    with FileLock(path + ".lock"):
        if os.path.exists(path):
            try:
                verify_shard(path)
                return path
            except DatasetError as e:
                print(f"{name}: {e}; deleting it and downloading again", flush=True)
                os.remove(path)
        for attempt in range(attempts):
            try:
                _fetch(url, path, timeout)
                print(f"{name}: downloaded ({os.path.getsize(path) / 1e6:.1f} MB)", flush=True)
                return path
            except FileNotFoundError as e:
                raise DatasetError(f"{e}: check --base-url / NANOCHAT_DATA_URL and the shard index") from e
            except (requests.RequestException, DatasetError, OSError) as e:
                if attempt + 1 == attempts:
                    raise DatasetError(f"could not download {url} after {attempts} attempts: {e}") from e
                wait = backoff * 2 ** attempt
                print(f"{name}: attempt {attempt + 1}/{attempts} failed ({e}); retrying in {wait:g}s", flush=True)
                time.sleep(wait)


def _claim_for_fineweb(directory, base_url):
    """Refuse to download into a directory holding a local corpus; record the source."""
    marker = read_marker(directory)
    if marker is not None and marker.get("source") != "fineweb-edu":
        raise DatasetError(
            f"{directory} holds the {marker.get('source')!r} corpus ({MARKER}); downloading FineWeb-Edu "
            f"shards into it would mix the two. Use another --data-dir, or delete {directory} first.")
    if marker is None:
        os.makedirs(directory, exist_ok=True)
        _write_json(os.path.join(directory, MARKER), {"source": "fineweb-edu", "url": source_url(base_url)})


def _wanted_shards(num_files):
    """The pinned val shard first (every run needs it), then train shards 0..num_files-1."""
    if num_files == -1:
        num_files = MAX_SHARD
    if not 0 <= num_files <= MAX_SHARD:
        raise ValueError(f"-n must be in 0..{MAX_SHARD} train shards (or -1 for all), got {num_files}")
    return [VAL_SHARD] + list(range(num_files))


def download(num_files, data_dir=None, workers=4, base_url=None, attempts=5, backoff=2.0, timeout=30):
    """Download the pinned val shard and train shards 0..num_files-1 (-1: all 1822)."""
    indices = _wanted_shards(num_files)
    directory = _data_dir(data_dir)
    _claim_for_fineweb(directory, base_url)
    print(f"Fetching {len(indices)} shards (val {shard_name(VAL_SHARD)} + {len(indices) - 1} train) from "
          f"{source_url(base_url)} into {directory} with {workers} workers", flush=True)

    def one(index):
        try:
            return download_shard(index, directory, base_url, attempts, backoff, timeout), None
        except DatasetError as e:
            return None, e

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(one, indices))
    failed = [e for _, e in results if e is not None]
    print(f"Shards ready: {len(indices) - len(failed)}/{len(indices)}", flush=True)
    if failed:
        lines = "\n  ".join(str(e) for e in failed[:5])
        raise DatasetError(f"{len(failed)} of {len(indices)} shards failed:\n  {lines}\n"
                           "Run the same command again to retry; finished shards are kept.")
    return [path for path, _ in results]


def source_reachable(base_url=None, timeout=5.0):
    """One quick request for the val shard's headers, no retries."""
    try:
        r = requests.head(f"{source_url(base_url)}/{shard_name(VAL_SHARD)}", timeout=timeout, allow_redirects=True)
        return r.status_code < 400
    except requests.RequestException:
        return False


# ----------------------------------------------------------------------------- listing

def list_parquet_files(split, data_dir=None):
    """Paths of the split's shards, in order: train = every shard but the pinned val one,
    val = shard_01822.parquet. Every file's footer is checked, so a corrupt shard fails
    here with the command to fix it rather than deep inside training."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    directory = _data_dir(data_dir)
    names = _shards_in(directory)
    if not names and read_marker(directory) is not None:
        raise DatasetError(f"no shards in {directory} (an unfinished build?): run {_fix_hint(directory)}")
    if not names:
        flag = _dir_flag(directory)
        raise DatasetError(f"no shards in {directory}: run `python -m nanochat.dataset -n 8{flag}` (FineWeb-Edu), "
                           f"or `python -m nanochat.dataset --offline{flag}` without network")
    val = shard_name(VAL_SHARD)
    files = [val] if split == "val" else [n for n in names if n != val]
    if split == "val" and val not in names:
        raise DatasetError(f"the pinned val shard {val} is missing from {directory}: run {_fix_hint(directory)}")
    if not files:
        raise DatasetError(f"{directory} holds no train shards (only {val}): run {_fix_hint(directory)}")
    paths = [os.path.join(directory, n) for n in files]
    for path in paths:
        try:
            verify_shard(path)
        except DatasetError as e:
            raise DatasetError(f"corrupt shard: {e}. Delete it and run {_fix_hint(directory)}") from e
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
    training tokens, naming the download that would fix it. The token count is an
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
    source = (read_marker(directory) or {}).get("source", "fineweb-edu")
    msg = (f"the train split in {directory} ({stats['files']} shards) holds about {usable:,} usable tokens "
           f"({how}), but the run needs {tokens_needed:,}")
    if source != "fineweb-edu":
        raise DatasetError(f"{msg}. It is the local {source!r} corpus: train for fewer iterations, or download "
                           "FineWeb-Edu shards into another --data-dir (`python -m nanochat.dataset -n N`).")
    per_shard = stats["text_bytes"] / stats["files"] if stats["files"] else FINEWEB_CHARS_PER_SHARD
    n = math.ceil(tokens_needed * chars_per_token / kept_fraction / per_shard)
    if n > MAX_SHARD:
        raise DatasetError(f"{msg}; even all {MAX_SHARD} train shards would not be enough: train for fewer iterations.")
    raise DatasetError(f"{msg}. Download more: `python -m nanochat.dataset -n {n}{_dir_flag(directory)}`")


# ------------------------------------------------------------------------ local corpora

def _write_shard(path, docs, rows_per_group):
    tmp = f"{path}.{os.getpid()}.tmp"
    # zstd level 3, no dictionary, no statistics: the layout of nanochat's FineWeb-Edu shards
    pq.write_table(pa.table({"text": pa.array(docs, type=pa.string())}), tmp, row_group_size=rows_per_group,
                   compression="zstd", compression_level=3, use_dictionary=False, write_statistics=False)
    os.replace(tmp, path)


def write_corpus(docs, data_dir, info, rows_per_group=LOCAL_ROW_GROUP, shard_chars=LOCAL_SHARD_CHARS,
                 val_every=VAL_EVERY):
    """Write documents as train shards plus the val shard (every `val_every`-th document,
    starting with the first) and a marker. A new train shard starts at the first row-group
    boundary after `shard_chars` characters. Replaces a local corpus already in the
    directory; refuses to touch downloaded shards. Returns the marker dict."""
    directory = _data_dir(data_dir)
    existing, marker = _shards_in(directory), read_marker(directory)
    if (existing or marker) and (marker or {}).get("source", "fineweb-edu") == "fineweb-edu":
        raise DatasetError(f"{directory} holds downloaded FineWeb-Edu shards: a local corpus would mix with "
                           "them. Use another --data-dir.")
    os.makedirs(directory, exist_ok=True)
    for name in existing:
        os.remove(os.path.join(directory, name))
    # Marked before writing, so that a build that fails halfway (bad input) leaves a
    # directory the next build is allowed to replace.
    _write_json(os.path.join(directory, MARKER), dict(info, complete=False))

    val, shard, shard_len, shard_idx, n_docs, n_chars = [], [], 0, 0, 0, 0

    def flush_shard():
        if shard_idx >= VAL_SHARD:
            raise DatasetError(f"more than {VAL_SHARD} train shards: raise shard_chars")
        _write_shard(os.path.join(directory, shard_name(shard_idx)), shard, rows_per_group)
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
    _write_shard(os.path.join(directory, shard_name(VAL_SHARD)), val, rows_per_group)
    info = dict(info, complete=True, documents=n_docs, characters=n_chars, train_shards=shard_idx,
                train_documents=n_docs - len(val), val_documents=len(val), rows_per_group=rows_per_group)
    _write_json(os.path.join(directory, MARKER), info)
    return info


def _arg_names(fn):
    """`(a, b, *args, key, **kw)` without defaults or annotations, whose reprs can hold
    machine-specific values (addresses, paths) that would make the corpus non-deterministic."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        names.append("*")
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return "(" + ", ".join(names) + ")"


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _definitions(node):
    """`node` and the classes and functions nested in it, following statement bodies only
    (much cheaper than ast.walk, which visits every expression)."""
    yield node
    stack = [node]
    while stack:
        stmt = stack.pop()
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(stmt, field, ()):
                if isinstance(child, _DEFS):
                    yield child
                if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                    stack.append(child)


def _source_documents(path, module):
    """Documents of one stdlib source file, read with ast/tokenize (never imported, so no
    module side effects): one for the module docstring and top-level comments, one per
    top-level class or function with the docstrings and comments inside it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        src = f.read()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    pieces, spans = {}, []  # top-level line (0 = module) -> [(line, text, is_docstring)]
    doc = ast.get_docstring(tree)
    if doc:
        pieces[0] = [(0, doc, True)]
    for node in tree.body:
        if not isinstance(node, _DEFS):
            continue
        spans.append((node.lineno, node.end_lineno))
        for sub in _definitions(node):
            doc = ast.get_docstring(sub)
            if doc:
                head = f"class {sub.name}" if isinstance(sub, ast.ClassDef) else f"def {sub.name}{_arg_names(sub)}"
                pieces.setdefault(node.lineno, []).append((sub.lineno, f"{head}\n{doc}", True))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                line = tok.start[0]
                owner = next((s for s, e in spans if s <= line <= e), 0)
                pieces.setdefault(owner, []).append((line, tok.string.lstrip("#").strip(), False))
    except (tokenize.TokenError, SyntaxError):
        pass
    docs = []
    for owner in sorted(pieces):
        blocks, prev = [], None
        for line, text, is_doc in sorted(pieces[owner], key=lambda p: p[0]):
            if not is_doc and prev == line - 1 and blocks and not blocks[-1][1]:
                blocks[-1][0].append(text)  # consecutive comment lines form one paragraph
            else:
                blocks.append(([text], is_doc))
            prev = None if is_doc else line
        body = "\n\n".join("\n".join(lines).strip() for lines, _ in blocks if "".join(lines).strip())
        if len(body) >= 40:
            docs.append(f"{module}\n\n{body}")
    return docs


def _compiled_module_documents(name):
    """Docstrings of a C module (math, itertools, sys...): these need an import, which for
    compiled stdlib modules runs no Python code."""
    module = importlib.import_module(name)
    members = vars(module)
    parts = [inspect.cleandoc(module.__doc__)] if isinstance(module.__doc__, str) else []
    for key, value in sorted(members.items()):
        if key.startswith("_"):
            continue
        # sys keeps the original of each hook a program may replace (pytest replaces
        # sys.unraisablehook) as __hook__: document that, whatever the process did.
        original = members.get(f"__{key}__")
        value = original if inspect.isroutine(original) else value
        if not (inspect.isroutine(value) or inspect.isclass(value)):
            continue
        if getattr(value, "__module__", name) != name or not isinstance(value.__doc__, str):
            continue
        parts.append(f"{name}.{key}\n{inspect.cleandoc(value.__doc__)}")
    return [f"{name}\n\n" + "\n\n".join(parts)] if parts else []


_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_SKIP_COMPILED = {"readline"}  # importing it may write terminal control codes


def collect_python_docs():
    """English text found on every machine with Python, in a fixed order: the stdlib's
    docstrings and comments (from source), the docstrings of its compiled modules, and the
    help topics of the reference manual (pydoc_data). Identical documents appear once."""
    root = sysconfig.get_paths()["stdlib"]
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for fname in sorted(f for f in filenames if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(dirpath, fname), root)[:-3]
            module = rel.replace(os.sep, ".").removesuffix(".__init__")
            docs += _source_documents(os.path.join(dirpath, fname), module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules (audioop, nis...) warn on import
        for name in sorted(sys.stdlib_module_names):
            if name.startswith("_") or name in _SKIP_COMPILED:
                continue
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec else None
            if origin == "built-in" or (origin or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                try:
                    docs += _compiled_module_documents(name)
                except ImportError:
                    continue
        from pydoc_data.topics import topics
    docs += [f"Python help: {key}\n\n{topics[key].strip()}" for key in sorted(topics)]
    seen = set()
    return [d for d in docs if not (d in seen or seen.add(d))]


def build_offline_corpus(data_dir=None, rows_per_group=LOCAL_ROW_GROUP, shard_chars=LOCAL_SHARD_CHARS):
    """Write the offline corpus (collect_python_docs) as shards. Deterministic for a given
    Python installation: sorted order, no timestamps."""
    directory = _data_dir(data_dir)
    docs = collect_python_docs()
    info = write_corpus(docs, directory, {"source": "offline", "python": platform.python_version()},
                        rows_per_group=rows_per_group, shard_chars=shard_chars)
    bar = "=" * 78
    print(f"{bar}\nOFFLINE CORPUS, not FineWeb-Edu: {info['documents']:,} documents, {info['characters'] / 1e6:.1f}M "
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


def offline_fallback(num_files, data_dir=None, workers=4, base_url=None):
    """Real shards when the source answers, the offline corpus when it does not. A
    directory that already holds a local corpus, or every requested shard, is used as is."""
    directory = _data_dir(data_dir)
    marker = read_marker(directory)
    if marker is not None and marker.get("source") in ("offline", "text"):
        print(f"Using the {marker['source']} corpus already in {directory} (delete it to download FineWeb-Edu)")
        return
    present = _shards_in(directory)
    if set(map(shard_name, _wanted_shards(num_files))) <= set(present) or source_reachable(base_url):
        download(num_files, directory, workers=workers, base_url=base_url)  # no request when all are present
        return
    if present:
        raise DatasetError(f"{source_url(base_url)} is unreachable and {directory} holds only part of the "
                           "requested FineWeb-Edu shards: retry with network, or use --offline with another --data-dir")
    print(f"{source_url(base_url)} is unreachable: building the offline corpus instead", flush=True)
    build_offline_corpus(directory)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m nanochat.dataset",
        description="Download FineWeb-Edu shards (train 0..N-1 plus the pinned val shard 01822), or build a "
                    "local corpus in the same format.")
    parser.add_argument("-n", "--num-files", type=int, default=-1,
                        help=f"train shards to download, 0..{MAX_SHARD} (-1: all); the val shard always comes too")
    parser.add_argument("-w", "--num-workers", type=int, default=4, help="parallel downloads")
    parser.add_argument("--base-url", default=None, help=f"shard source (default $NANOCHAT_DATA_URL or {BASE_URL})")
    parser.add_argument("--data-dir", default=None, help="shard directory (default $NANOCHAT_BASE_DIR/base_data)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--offline", action="store_true",
                      help="build the offline corpus from the Python installation's documentation (no network)")
    mode.add_argument("--offline-fallback", action="store_true",
                      help="probe the source once (5 s); download when it answers, else build the offline corpus")
    mode.add_argument("--from-text", nargs="+", metavar="PATH",
                      help=".txt/.md files (cut into ~4000-character blocks at blank lines), .jsonl files "
                           "(field `text`, one document per line), or directories of them")
    args = parser.parse_args(argv)
    try:
        if args.offline:
            build_offline_corpus(args.data_dir)
        elif args.from_text:
            build_text_corpus(args.from_text, args.data_dir)
        elif args.offline_fallback:
            offline_fallback(args.num_files, args.data_dir, args.num_workers, args.base_url)
        else:
            download(args.num_files, args.data_dir, args.num_workers, args.base_url)
    except (DatasetError, ValueError) as e:
        raise SystemExit(f"nanochat.dataset: error: {e}")


if __name__ == "__main__":
    main()
