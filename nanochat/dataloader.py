"""Batches of token ids for pretraining: BOS-aligned best-fit packing, row groups strided
across ranks, tokenization in a background thread, and an exact resumable state.

Each row of a batch holds T+1 tokens built from whole documents, each starting with
<|bos|>: the largest buffered document that still fits goes in next; when none fits, the
shortest one is cropped to fill the row exactly (its remainder is dropped). So every row
starts with BOS and there is no padding. x = row[:-1], y = row[1:].

The buffer is topped up to `buffer_size` documents one document at a time; with
`batch_refill` one tokenizer batch at a time instead, so that it may hold up to a batch
minus one more: nanochat's own loader (92d63d4 as at 4d8dbaf) refills that way, and the
2026-07 trunk does too, so that its batches are nanochat's (tests/test_dataloader_2026.py).

Rank r of W reads row groups r, r+W, r+2W, ... of every file of the split, in file order;
after the last file it starts again at file 0 with the next epoch. With an `order_seed`, each
rank reads its row groups in an order shuffled by that seed instead (the same order every
epoch), so that runs can differ in their data order alone; without one the order is
nanochat's fixed one. With epochs=1 (for evaluation) it stops after one pass instead: the
last batch is completed with ignored targets (-1, inputs BOS) and the next call raises
StopIteration, so a small split is read exactly once.

state_dict() describes what next() has consumed, never what the prefetch thread read
ahead: the position of the last document taken into the buffer, and the buffered
documents themselves as (file, row group, index) references. A loader rebuilt from it
re-reads and re-tokenizes those documents and then yields exactly the batches the
uninterrupted loader would have. Each rank saves and restores its own state.

reshard_states() turns the states of W ranks into states for W' ranks (a run resumed on
another number of GPUs). Guarantee, for the epoch in flight (the latest one any old rank
had reached): no row group is read twice; the W' ranks share out, in turn, the row groups
no old rank had started; of the row groups the old ranks were in the middle of (at most
one each) the unread rest is skipped; every document the old ranks had buffered but not
yet packed is packed by a new rank (old rank r's by new rank r mod W'); an old rank still
in the epoch before skips the rest of it. Later epochs are read as a W'-rank run reads
them. The batches differ from an uninterrupted run's: resumption is not bitwise.

SplitRows packs the first rows of a split as one process does and gives rank r of W rows
r, r+W, ...: evaluation sees the same rows whatever the number of ranks, and a split
with fewer row groups than ranks leaves some ranks with nothing to add, never an error.

Shutdown: the prefetch thread checks a stop event between tokenizer batches and never
blocks on the queue for long. close() (also on `with` exit, garbage collection, and for
every loader still open at interpreter exit) sets the event and joins the thread. The
join at exit matters: a daemon thread still inside pyarrow or the tokenizer when Python
finalizes is unwound through native frames and aborts the process ("terminate called
without an active exception").
"""

import atexit
import bisect
import os
import queue
import sys
import threading
import weakref
from collections import deque

import numpy as np
import pyarrow.parquet as pq
import torch

from nanochat.common import print0
from nanochat.data.shards import DatasetError, fix_hint, list_parquet_files

STATE_VERSION = 1
BUFFER_SIZE = 1000  # documents held for best-fit packing
# How long close() waits for the prefetch thread to finish the tokenizer batch it is in.
JOIN_TIMEOUT = 60.0
_END = "end of the pass"  # the prefetch thread's last item when epochs=1
_open_loaders = weakref.WeakSet()


@atexit.register
def _close_open_loaders():
    for loader in list(_open_loaders):
        loader.close()


class _RowGroupReader:
    """Texts of one row group at a time, keeping the last file open."""

    def __init__(self, paths):
        self.paths = paths
        self._open = (None, None)

    def __call__(self, file_idx, rg):
        path = self.paths[file_idx]
        try:
            if self._open[0] != file_idx:
                self._open = (file_idx, pq.ParquetFile(path))
            return self._open[1].read_row_group(rg, columns=["text"]).column("text").to_pylist()
        except Exception as e:  # pyarrow raises several types for a garbled row group
            directory = os.path.dirname(path)
            raise DatasetError(f"corrupt shard: row group {rg} of {path} cannot be read ({type(e).__name__}: "
                               f"{e}). Delete the file and run {fix_hint(directory)}") from e


def _row_groups(paths):
    """Documents per row group, per file (parquet metadata only)."""
    return [[meta.row_group(rg).num_rows for rg in range(meta.num_row_groups)]
            for meta in (pq.ParquetFile(path).metadata for path in paths)]


def _plan(row_groups, rank, world_size, order_seed=None, read=None):
    """Rank `rank`'s row groups in reading order, as (file, row group): nanochat's striding,
    rank, rank+W, ... of every file; or, given `read` (the row groups started before a change
    of world size), every `world_size`-th of the row groups not in it. With an `order_seed`,
    shuffled by that seed (the state refers to row groups by (file, row group), so a resumed
    loader finds its place in the same shuffled plan)."""
    if read is None:
        plan = [(f, rg) for f, groups in enumerate(row_groups) for rg in range(rank, len(groups), world_size)]
    else:
        rest = [(f, rg) for f, groups in enumerate(row_groups) for rg in range(len(groups)) if (f, rg) not in read]
        plan = rest[rank::world_size]
    if order_seed is not None:
        np.random.default_rng(order_seed).shuffle(plan)
    return plan


def _buffer_size(row_groups, plan, requested):
    """A split smaller than the buffer (a local val shard) would otherwise be cycled through
    several epochs just to fill it: hold at most one epoch of this rank's share."""
    return max(1, min(requested, sum(row_groups[f][rg] for f, rg in plan)))


def _encode_read(read, row_groups):
    """A set of (file, row group) as one hex bitmask per file (compact in the checkpoint)."""
    return [format(sum(1 << rg for rg in range(len(groups)) if (f, rg) in read), "x")
            for f, groups in enumerate(row_groups)]


def _decode_read(masks):
    return {(f, rg) for f, mask in enumerate(masks) for rg in range(int(mask, 16).bit_length())
            if int(mask, 16) >> rg & 1}


def _check_files(split, saved, files):
    if saved != files:
        raise DatasetError(f"the {split} files changed since the state was saved ({len(saved)} then, "
                           f"{len(files)} now): resume with the same shards in the data dir")


def _produce(plan, resumed, paths, start, tokenizer, bos, batch_size, threads, out, stop, epochs):
    """Prefetch thread: from `start` = (epoch, plan index, doc), tokenize this rank's
    documents in order, forever (or `epochs` passes, then _END), and put lists of
    ((epoch, file, row group, doc), ids) on `out`. `resumed` = (epoch, plan) replaces the
    plan for that one epoch (after a change of world size).
    Holds no reference to the loader, so a dropped loader can be collected (and stop us)."""

    def put(item):
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        read = _RowGroupReader(paths)
        epoch, i, first = start
        while not stop.is_set():
            current = resumed[1] if resumed is not None and epoch == resumed[0] else plan
            if i == len(current):  # (a resumed epoch can leave a rank nothing)
                if epoch == epochs:
                    put(_END)
                    return
                epoch, i, first = epoch + 1, 0, 0
                continue
            f, rg = current[i]
            texts = read(f, rg)
            for s in range(first, len(texts), batch_size):
                ids = tokenizer.encode(texts[s:s + batch_size], prepend=bos, num_threads=threads)
                if not put([((epoch, f, rg, s + j), np.asarray(d, dtype=np.int32)) for j, d in enumerate(ids)]):
                    return
            first, i = 0, i + 1
    except BaseException as e:  # surfaced by next() in the training thread
        put(e)


class BestFitLoader:
    """Iterator of (x, y), each (B, T) int64 on `device`; see the module docstring.

    x and y are fresh tensors every step (safe to keep across next()). On CUDA the rows are
    assembled in pinned host memory and copied with one non-blocking host-to-device copy.
    epochs: None cycles the split forever (training); 1 reads it once (evaluation)."""

    def __init__(self, tokenizer, B, T, split, device="cpu", rank=0, world_size=1, data_dir=None, state=None,
                 buffer_size=BUFFER_SIZE, tokenizer_threads=4, tokenizer_batch_size=128, order_seed=None,
                 epochs=None, batch_refill=False):
        if B <= 0 or T <= 0 or buffer_size <= 0 or tokenizer_batch_size <= 0:
            raise ValueError(f"B, T, buffer_size and tokenizer_batch_size must be positive "
                             f"(got {B}, {T}, {buffer_size}, {tokenizer_batch_size})")
        if epochs not in (None, 1):
            raise ValueError(f"epochs must be None (cycle) or 1 (one pass), got {epochs!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.B, self.T, self.split = B, T, split
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.tokenizer, self.bos = tokenizer, tokenizer.get_bos_token_id()
        self.paths = list_parquet_files(split, data_dir)
        self.files = [os.path.basename(p) for p in self.paths]
        self.row_groups = _row_groups(self.paths)
        self.order_seed = order_seed
        self.batch_refill = batch_refill
        # This rank's row groups in reading order, as (file index, row group index).
        self.plan = _plan(self.row_groups, rank, world_size, order_seed)
        self.buffer_size = _buffer_size(self.row_groups, self.plan, buffer_size)
        if not self.plan:
            raise DatasetError(f"rank {rank} of {world_size} has nothing to read: the {split} split has "
                               f"{len(self.paths)} files with {sum(map(len, self.row_groups))} row groups in all, "
                               f"and each rank reads row groups rank, rank+W, ... of every file. Use fewer ranks "
                               f"or a corpus with more row groups per shard.")

        # The buffer: seq -> (file, row group, doc index, ids), plus (length, seq) kept sorted
        # so best-fit is a bisection. seq grows with arrival, so ties go to the oldest document.
        self._docs, self._by_len, self._next_seq = {}, [], 0
        self._cursor = None  # (epoch, file, row group, doc) of the last document taken into the buffer
        # (epoch, plan, row groups read before as saved) of an epoch resumed on another world size
        self._resumed = None
        self.epoch, self.epochs = 1, epochs
        self._ended = False  # the one pass of an epochs=1 loader has been read
        self.stats = {"batches": 0, "docs": 0, "tokens_kept": 0, "tokens_cropped": 0}
        if state is not None:
            self._load_state(state)
        if self._cursor is None:
            start = (self.epoch, 0, 0)
        else:
            epoch, f, rg, doc = self._cursor
            start = (epoch, self._plan_for(epoch).index((f, rg)), doc + 1)

        self._pending = deque()  # tokenized by the prefetch thread, not yet in the buffer
        self._queue = queue.Queue(maxsize=max(4, 2 * -(-buffer_size // tokenizer_batch_size)))
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_produce, daemon=True, name=f"dataloader-{split}-rank{rank}",
            args=(self.plan, self._resumed, self.paths, start, tokenizer, self.bos, tokenizer_batch_size,
                  tokenizer_threads, self._queue, self._stop, epochs))
        self._thread.start()
        weakref.finalize(self, self._stop.set)
        _open_loaders.add(self)

        self._rows = np.empty((B, T + 1), dtype=np.int64)
        if self.device.type == "cuda":
            # Two pinned buffers in turn; before refilling one, wait for the copy that read it.
            self._pinned = [torch.empty((2, B, T), dtype=torch.int64).pin_memory() for _ in range(2)]
            self._copied = [None, None]

    def _plan_for(self, epoch):
        return self._resumed[1] if self._resumed is not None and epoch == self._resumed[0] else self.plan

    # ---------------------------------------------------------------- buffer and packing

    def _insert(self, f, rg, doc, ids):
        seq = self._next_seq
        self._next_seq += 1
        self._docs[seq] = (f, rg, doc, ids)
        bisect.insort(self._by_len, (len(ids), seq))

    def _pull(self):
        """Move the next document of the stream from the prefetch thread into the buffer;
        at the end of an epochs=1 pass, set _ended instead."""
        while not self._pending:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the {self.split} dataloader is closed") from None
                continue
            if isinstance(item, DatasetError):
                raise item
            if isinstance(item, BaseException):
                raise RuntimeError(f"the {self.split} dataloader's prefetch thread failed: {item}") from item
            if item is _END:
                self._ended = True
                return
            self._pending.extend(item)
        (epoch, f, rg, doc), ids = self._pending.popleft()
        if epoch > self.epoch:
            self.epoch = epoch
            print0(f"dataloader: the {self.split} split is exhausted, starting epoch {epoch}")
        self._cursor = (epoch, f, rg, doc)
        self._insert(f, rg, doc, ids)

    def _take(self, room):
        """Remove and return the ids for the next `room`-or-fewer slots of a row: the
        largest document that fits, else the shortest one cropped to `room`."""
        i = bisect.bisect_right(self._by_len, (room, self._next_seq))
        if i > 0:
            i = bisect.bisect_left(self._by_len, (self._by_len[i - 1][0], -1))  # oldest of that length
        _, seq = self._by_len.pop(i)
        ids = self._docs.pop(seq)[3]
        self.stats["docs"] += 1
        self.stats["tokens_kept"] += min(room, len(ids))
        self.stats["tokens_cropped"] += max(0, len(ids) - room)
        return ids[:room]

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise RuntimeError(f"the {self.split} dataloader is closed")
        rows, width = self._rows, self.T + 1
        for b in range(self.B):
            pos = 0
            while pos < width:
                while len(self._docs) < self.buffer_size and not self._ended:
                    self._pull()
                    while self.batch_refill and self._pending:  # the rest of that tokenizer batch
                        self._pull()
                if not self._docs:
                    break
                ids = self._take(width - pos)
                rows[b, pos:pos + len(ids)] = ids
                pos += len(ids)
            if pos < width:  # the end of the pass: pad this row and the rest with -1
                if b == 0 and pos == 0:
                    raise StopIteration
                rows[b, pos:] = -1
                rows[b + 1:] = -1
                break
        self.stats["batches"] += 1
        return self._to_device(rows)

    def _inputs_targets(self, rows):
        """Views x, y of the rows; padding (-1) becomes BOS in x and stays -1 (ignored) in y."""
        x, y = rows[:, :-1], rows[:, 1:]
        if self._ended:
            x = np.where(x < 0, self.bos, x)
        return x, y

    def _to_device(self, rows):
        x_rows, y_rows = self._inputs_targets(rows)
        if self.device.type != "cuda":
            x = torch.from_numpy(np.array(x_rows))
            y = torch.from_numpy(np.array(y_rows))
            return (x, y) if self.device.type == "cpu" else (x.to(self.device), y.to(self.device))
        k = self.stats["batches"] % 2
        if self._copied[k] is not None:
            self._copied[k].synchronize()
        host = self._pinned[k]
        host[0].numpy()[:] = x_rows
        host[1].numpy()[:] = y_rows
        dev = torch.empty((2, self.B, self.T), dtype=torch.int64, device=self.device)
        dev.copy_(host, non_blocking=True)
        self._copied[k] = torch.cuda.Event()
        self._copied[k].record()
        return dev[0], dev[1]

    @property
    def packing_efficiency(self):
        """Fraction of the tokens taken from documents that ended up in a row (the rest
        were cropped away)."""
        seen = self.stats["tokens_kept"] + self.stats["tokens_cropped"]
        return self.stats["tokens_kept"] / seen if seen else 1.0

    # ---------------------------------------------------------------------------- state

    def state_dict(self):
        """JSON-serializable: what next() has consumed so far (see the module docstring)."""
        state = {
            "version": STATE_VERSION, "split": self.split, "rank": self.rank, "world_size": self.world_size,
            "files": self.files, "buffer_size": self.buffer_size, "vocab_size": self.tokenizer.get_vocab_size(),
            "epoch": self.epoch,
            "cursor": None if self._cursor is None else list(self._cursor),  # [epoch, file, row group, doc]
            "buffer": [[f, rg, doc] for f, rg, doc, _ in self._docs.values()],  # oldest first
            "stats": dict(self.stats),
        }
        if self.batch_refill:  # (absent from the states of a loader refilled by document)
            state["batch_refill"] = True
        if self._resumed is not None and self.epoch <= self._resumed[0]:
            state["resumed"] = {"epoch": self._resumed[0], "read": self._resumed[2]}
        return state

    def _load_state(self, state):
        expected = {"version": STATE_VERSION, "split": self.split, "rank": self.rank, "world_size": self.world_size,
                    "buffer_size": self.buffer_size, "vocab_size": self.tokenizer.get_vocab_size()}
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(f"dataloader state has {key}={state.get(key)!r} but this loader has {value!r}: "
                                 "resume with the same split, rank, world size, buffer size and tokenizer")
        if state.get("batch_refill", False) != self.batch_refill:
            raise ValueError(f"dataloader state has batch_refill={state.get('batch_refill', False)} but this loader "
                             f"has {self.batch_refill}: resume on the trunk the run started on")
        _check_files(self.split, state["files"], self.files)
        self.epoch = state["epoch"]
        self.stats = dict(state["stats"])
        if "resumed" in state:
            masks = state["resumed"]["read"]
            plan = _plan(self.row_groups, self.rank, self.world_size, self.order_seed, read=_decode_read(masks))
            self._resumed = (state["resumed"]["epoch"], plan, masks)
        if state["cursor"] is not None:
            self._cursor = tuple(state["cursor"])
        # Re-read each row group once, re-tokenize the buffered documents, keep their order.
        wanted = {}
        for f, rg, doc in state["buffer"]:
            wanted.setdefault((f, rg), []).append(doc)
        read, ids = _RowGroupReader(self.paths), {}
        for (f, rg), docs in sorted(wanted.items()):
            texts = read(f, rg)
            for doc, toks in zip(docs, self.tokenizer.encode([texts[d] for d in docs], prepend=self.bos)):
                ids[(f, rg, doc)] = np.asarray(toks, dtype=np.int32)
        for f, rg, doc in state["buffer"]:
            self._insert(f, rg, doc, ids[(f, rg, doc)])

    def close(self):
        """Stop the prefetch thread and wait for it (it finishes the tokenizer batch it is
        in). Also done on `with` exit, on garbage collection (without the wait) and, for
        every loader still open, at interpreter exit."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=JOIN_TIMEOUT)
        if self._thread.is_alive():
            print(f"warning: the {self.split} dataloader's prefetch thread did not stop within "
                  f"{JOIN_TIMEOUT:.0f} s", file=sys.stderr)
        _open_loaders.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def reshard_states(states, world_size, data_dir=None, order_seed=None, buffer_size=BUFFER_SIZE):
    """Loader states for `world_size` ranks from `states`, the states saved by the W ranks of
    a run (states[r] by rank r), with the guarantee of the module docstring. Returns
    (new states, what happened: counts for the log)."""
    old_world, first = len(states), states[0]
    paths = list_parquet_files(first["split"], data_dir)
    _check_files(first["split"], first["files"], [os.path.basename(p) for p in paths])
    row_groups = _row_groups(paths)
    epoch = max(s["epoch"] for s in states)
    read, partial, skipped_docs, behind = set(), 0, 0, 0
    for r, s in enumerate(states):
        # an old rank itself resumed on another world size: its epoch's plan left out `prior`
        prior_epoch, prior = (s["resumed"]["epoch"], _decode_read(s["resumed"]["read"])) if "resumed" in s else (0, None)
        if prior_epoch == epoch:
            read |= prior
        if s["cursor"] is None:
            continue
        cursor_epoch, f, rg, doc = s["cursor"]
        plan = _plan(row_groups, r, old_world, order_seed, read=prior if prior_epoch == cursor_epoch else None)
        at = plan.index((f, rg))
        skipped_docs += row_groups[f][rg] - doc - 1
        if cursor_epoch < epoch:  # this rank had not finished the previous epoch: the rest is dropped
            behind += 1
            skipped_docs += sum(row_groups[g][h] for g, h in plan[at + 1:])
            continue
        partial += doc + 1 < row_groups[f][rg]
        read |= set(plan[:at + 1])
    new_states = []
    for rank in range(world_size):
        mine = [s for r, s in enumerate(states) if r % world_size == rank]
        new_states.append({
            "version": STATE_VERSION, "split": first["split"], "rank": rank, "world_size": world_size,
            "files": first["files"], "vocab_size": first["vocab_size"],
            "buffer_size": _buffer_size(row_groups, _plan(row_groups, rank, world_size, order_seed), buffer_size),
            "epoch": epoch, "cursor": None,
            "buffer": [ref for s in mine for ref in s["buffer"]],
            "stats": {k: sum(s["stats"][k] for s in mine) for k in first["stats"]},
            "resumed": {"epoch": epoch, "read": _encode_read(read, row_groups)},
            **({"batch_refill": True} if first.get("batch_refill") else {}),
        })
    summary = {"epoch": epoch, "row_groups": sum(map(len, row_groups)), "read": len(read),
               "partial": partial, "skipped_docs": skipped_docs, "behind": behind,
               "carried_docs": sum(len(s["buffer"]) for s in states)}
    return new_states, summary


class SplitRows:
    """The first `max_rows` rows (T+1 tokens each) of a split, packed as one process packs
    them and read once at most, of which rank r of W keeps rows r, r+W, ... So an evaluation
    over them sums the same rows whatever the number of ranks (or the batch size); a rank
    left without rows (a split smaller than the ranks) adds nothing. `total` rows in all;
    `exhausted` when the split ended before max_rows."""

    def __init__(self, tokenizer, T, split, max_rows, rank=0, world_size=1, data_dir=None, batch_refill=False):
        self.bos, rows = tokenizer.get_bos_token_id(), []
        with BestFitLoader(tokenizer, min(max_rows, 64), T, split, data_dir=data_dir, epochs=1,
                           batch_refill=batch_refill) as loader:
            for x, y in loader:
                packed = np.concatenate([x[:, :1].numpy(), y.numpy()], axis=1).astype(np.int32)
                rows += [row for row in packed if (row[1:] >= 0).any()]  # drop the padding rows of the end
                if len(rows) >= max_rows:
                    break
        self.total = min(len(rows), max_rows)
        self.exhausted = len(rows) < max_rows
        self.rows = rows[rank:self.total:world_size]

    def num_batches(self, B):
        return -(-len(self.rows) // B)

    def batches(self, B, device="cpu"):
        """(x, y) of B rows each; the last batch is completed with ignored rows (x BOS, y -1),
        so that a compiled model sees one shape."""
        for s in range(0, len(self.rows), B):
            chunk = np.full((B, len(self.rows[0])), -1, dtype=np.int64)
            chunk[:len(self.rows[s:s + B])] = self.rows[s:s + B]
            x = torch.from_numpy(np.where(chunk[:, :-1] < 0, self.bos, chunk[:, :-1]))
            y = torch.from_numpy(np.ascontiguousarray(chunk[:, 1:]))
            yield x.to(device), y.to(device)


def build_val_loader(tokenizer, B, T, device="cpu", rank=0, world_size=1, data_dir=None, **kwargs):
    """A fresh loader on the pinned val shard. Build one per evaluation: it always yields
    the same first batches, so val bpb is comparable across steps and runs."""
    return BestFitLoader(tokenizer, B, T, "val", device=device, rank=rank, world_size=world_size,
                         data_dir=data_dir, **kwargs)
