"""What every rank of a training run checks before step 0, so that nothing knowable at the
start fails the run after its training: its share of the data (train row groups; its val
rows, which may be none when the val split is smaller than the ranks: evaluation then
takes nothing from that rank), the tokenizer and the train shards (the same on every rank:
on several nodes each has its own disk), and the run directory, which every rank writes its
optimizer shard to: writable, and one directory that every rank sees.
"""

import hashlib
import os
import socket
import time

from nanochat.checkpoint_manager import atomic_write

# A network filesystem may show another node's new file a little late.
VISIBLE_WITHIN_S = 10


def _probe(run_dir, rank):
    return os.path.join(run_dir, f".probe_rank{rank}")


def rank_facts(rank, run_dir, token_bytes, train_loader, val_rows):
    """This rank's share, and a probe file written into the run directory (OSError: an
    error naming the rank and the directory)."""
    try:
        atomic_write(_probe(run_dir, rank), socket.gethostname())
    except OSError as e:
        raise SystemExit(f"error: rank {rank} cannot write to the run directory {run_dir} ({e}); every rank "
                         "writes its optimizer shard there: fix the permissions or free space, or point "
                         "NANOCHAT_BASE_DIR elsewhere") from None
    return {"rank": rank, "host": socket.gethostname(), "vocab": len(token_bytes),
            "tokenizer": hashlib.sha256(token_bytes.cpu().numpy().tobytes()).hexdigest(),
            "train_files": train_loader.files, "train_row_groups": len(train_loader.plan),
            "val_rows": None if val_rows is None else len(val_rows.rows),
            "val_total": None if val_rows is None else val_rows.total}


def check(facts, run_dir, rank):
    """Compare every rank's facts (gathered) with rank 0's, and look for every rank's probe
    file; one error line naming the rank and the fix."""
    first = facts[0]
    for other in facts[1:]:
        where = f"rank {other['rank']} ({other['host']})"
        if other["tokenizer"] != first["tokenizer"]:
            raise SystemExit(f"error: {where} has another tokenizer ({other['vocab']} tokens) than rank 0 "
                             f"({first['host']}, {first['vocab']} tokens): give every node the same "
                             "$NANOCHAT_BASE_DIR/tokenizer")
        if other["train_files"] != first["train_files"]:
            raise SystemExit(f"error: {where} sees {len(other['train_files'])} train shards, rank 0 "
                             f"({first['host']}) {len(first['train_files'])}: every node needs the same shards "
                             "in its data directory")
    deadline = time.time() + VISIBLE_WITHIN_S
    while (unseen := [f for f in facts if not os.path.exists(_probe(run_dir, f["rank"]))]) and time.time() < deadline:
        time.sleep(0.5)
    if unseen:
        hosts = sorted({f["host"] for f in unseen})
        raise SystemExit(f"error: rank {rank} ({socket.gethostname()}) cannot see the files rank(s) "
                         f"{', '.join(str(f['rank']) for f in unseen)} ({', '.join(hosts)}) wrote into the run "
                         f"directory {run_dir}: every rank writes its checkpoint files there, so on several "
                         "nodes it must be on a filesystem they share (set NANOCHAT_BASE_DIR)")


def remove_probe(run_dir, rank):
    """After every rank has checked (a barrier)."""
    os.remove(_probe(run_dir, rank))


def summary(facts):
    """One log line: what was checked, and each rank's share."""
    train = [f["train_row_groups"] for f in facts]
    line = (f"checked before step 0: {len(facts)} rank(s) on {len({f['host'] for f in facts})} host(s); train row "
            f"groups per rank {min(train)}-{max(train)}")
    if facts[0]["val_rows"] is not None:
        val = [f["val_rows"] for f in facts]
        line += f"; val rows per rank {min(val)}-{max(val)} of {facts[0]['val_total']}"
    return (line + f"; the same {facts[0]['vocab']}-token tokenizer and train shards on every rank; run directory "
            + ("writable and shared" if len(facts) > 1 else "writable"))
