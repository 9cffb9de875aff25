"""The frame's former module name (now `nanochat.connections.frame`): a wiring written against
`from nanochat.connections.trunk import ConnectionLayer` keeps importing."""

from nanochat.connections import frame as _frame


def __getattr__(name):
    return getattr(_frame, name)
