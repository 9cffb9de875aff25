"""The frame's former module name (now `nanochat.connections.frame`; "trunk" names nanochat's
recipe, nanochat/trunks.py): a wiring written against `from nanochat.connections.trunk import
ConnectionLayer` keeps importing. A wiring imports the layer bases from `nanochat.connections`."""

from nanochat.connections import frame as _frame


def __getattr__(name):
    return getattr(_frame, name)
