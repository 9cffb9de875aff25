"""Preemption: the signal a cluster sends before it takes the machines away (SLURM's
`--signal`, Kubernetes' and spot instances' SIGTERM) makes a training run save a checkpoint
and exit resumably, instead of dying and losing every step since the last checkpoint.

The handler only records the signal; a second one, while the checkpoint is written, is noted
and ignored, so the write is never interrupted (and the writes are atomic anyway). The
training loop reads the record once per step, inside the step's own all-reduce, so every
rank stops after the same step even when the signal reached only some of them.
"""

import argparse
import os
import signal

# EX_TEMPFAIL of sysexits.h, "temporary failure, the user is invited to retry": the exit
# status of a run stopped by a signal after saving; speedrun.sh reads it as "resumable".
EXIT_PREEMPTED = 75
CHOICES = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT")
DEFAULT = "SIGTERM,SIGUSR1"


def parse_signals(text):
    """An argparse type: 'none', or names from CHOICES (the SIG prefix optional) separated by
    commas. Returns the canonical text, e.g. 'SIGTERM,SIGUSR1', or 'none'."""
    text = str(text).strip()
    if text.lower() == "none":
        return "none"
    names = list(dict.fromkeys(n if n.startswith("SIG") else "SIG" + n
                               for n in (part.strip().upper() for part in text.split(",")) if n))
    if not names or any(n not in CHOICES for n in names):
        raise argparse.ArgumentTypeError(f"expected 'none' or a comma-separated list of {', '.join(CHOICES)}, "
                                         f"got {text!r}")
    return ",".join(names)


class StopRequest:
    """Installs the handlers for `signals` (parse_signals' text); `.signal` is the first
    signal received (None before). `announce` prints one line per signal (rank 0 does)."""

    def __init__(self, signals, announce=True):
        self.signal = None
        self.announce = announce
        for name in () if signals == "none" else signals.split(","):
            signal.signal(getattr(signal, name), self._handle)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signal is None:
            self.signal = name
            line = f"{name} received: finishing the step in flight, then saving a checkpoint\n"
        else:
            line = f"{name} received again: ignored, the checkpoint is being written\n"
        if self.announce:  # os.write: print() here could re-enter a print the signal interrupted
            os.write(1, line.encode())

    @property
    def requested(self):
        return self.signal is not None
