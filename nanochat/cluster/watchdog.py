"""One rank fails, all stop: a rank that fails (a corrupt shard, a full disk, a bug) writes its
`error:` line into the process group's key-value store, and a watchdog thread in every other
rank, polling the store about once a second, prints that line and exits with the same
status. Without it the other ranks would wait in their next collective until the timeout
(`--dist-timeout`, minutes), and, on several nodes, nobody would say why.

torchrun stops the other workers of its own node when one fails, but not those of other
nodes, nor ranks launched some other way; and a collective does not notice a peer that is
still alive but failing. So this rides on the c10d TCPStore every launch already has
(MASTER_ADDR:MASTER_PORT, whether the agent or rank 0 hosts it), through a client of its
own, gloo and NCCL alike. A store that stops answering (its host exited) ends the watch
quietly: a finished rank must not take the others down.
"""

import atexit
import json
import os
import sys
import threading
import time
from datetime import timedelta

POLL_S = 1.0
ACK_WAIT_S = 5.0  # how long a failing rank waits for the others to have read its line

_watch = None  # (store, rank, world size, stop event, thread) while watching


def _keys():
    """The failure's line, how many ranks have read it, how many have failed themselves. A
    torchrun restart reuses the agent's store: keys of an earlier attempt must not count."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return tuple(f"nanochat/{name}/{attempt}" for name in ("failure", "failure_seen", "failed"))


def _poll(store, rank, stop):
    key, seen, _ = _keys()
    while not stop.wait(POLL_S):
        try:
            if not store.check([key]):
                continue
            failure = json.loads(store.get(key))
            if stop.is_set() or failure["rank"] == rank:
                return
            store.add(seen, 1)
        except Exception:  # the store's host is gone: nothing more to hear
            return
        sys.stdout.flush()
        print(f"error: rank {failure['rank']}: {failure['line'].removeprefix('error: ')}", file=sys.stderr, flush=True)
        os._exit(failure["code"])


def start(rank, world_size, timeout_s=60):
    """Watch for another rank's failure (a daemon thread). Needs MASTER_ADDR/MASTER_PORT, as
    torchrun sets them; without them, or when the store cannot be reached, says so and
    leaves the run to the collective timeout."""
    global _watch
    import torch.distributed as dist
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=timeout_s))
    except (KeyError, ValueError, RuntimeError) as e:
        print(f"warning: no failure watchdog ({type(e).__name__}: {e}); a failing rank leaves the others "
              f"waiting for the collective timeout", file=sys.stderr, flush=True)
        return
    stop = threading.Event()
    thread = threading.Thread(target=_poll, args=(store, rank, stop), daemon=True, name="failure-watchdog")
    thread.start()
    _watch = (store, rank, world_size, stop, thread)


def stop():
    """End the watch (a normal end of the run)."""
    global _watch
    if _watch is not None:
        _watch[3].set()
        _watch[4].join(timeout=2 * POLL_S)
        _watch = None


def _exit_now(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def report(line, code):
    """This rank fails with `line`: tell the other ranks, and give them up to ACK_WAIT_S to
    read it before this process (which may host the store) exits. The exit then skips the
    interpreter's teardown, where the process group's would wait for the peers it is
    leaving. A no-op when not watching."""
    global _watch
    if _watch is None:
        return
    store, rank, world_size, stop_event, _ = _watch
    stop_event.set()
    _watch = None
    key, seen, failed = _keys()
    try:
        store.set(key, json.dumps({"rank": rank, "line": line, "code": code}))
        store.add(failed, 1)
        deadline = time.time() + ACK_WAIT_S
        # until every other rank has read a failure or failed itself (a mistake all ranks make)
        while store.add(seen, 0) + store.add(failed, 0) - 1 < world_size - 1 and time.time() < deadline:
            time.sleep(0.1)
    except Exception:  # the store is gone: the others will hit the collective timeout
        pass
    atexit.register(_exit_now, code)  # runs first, once the error line or traceback is out
