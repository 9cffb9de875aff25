"""torch.library.custom_op for this package's operators (nanochat::...), defined once per process.

An exported model's code (nanochat/interop/hf/assemble.py) is a copy of this package that transformers
imports beside the project itself, so the same operators can be defined twice in one process.
torch.library.custom_op overwrites an existing definition: it destroys the first one's
registrations, while the first module's callers keep its operator handle, so their next call
reaches a freed operator (seen as `MemoryError: std::bad_alloc` from the op, or a segmentation
fault, at random calls after a model was loaded from its export). Here a second definition
returns the first instead, which serves both: an export carries the code of the version that
wrote it, the same ops as the project's unless the two versions differ. torch keeps
no public registry of custom ops: `OPDEFS` (torch._library.custom_ops, in every torch the
project supports) is the one custom_op itself fills.
"""

import torch
from torch._library.custom_ops import OPDEFS


def custom_op(qualname, mutates_args=()):
    """Decorator: torch.library.custom_op(qualname, mutates_args=...), or the definition of
    `qualname` that this process already has."""
    def define(fn):
        existing = OPDEFS.get(qualname)
        if existing is not None:
            return existing
        return torch.library.custom_op(qualname, mutates_args=mutates_args)(fn)
    return define
