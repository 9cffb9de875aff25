"""The package's custom ops survive a second copy of their modules in the same process, as
when transformers imports an exported model's code beside the project (nanochat/interop/hf/assemble.py):
torch.library.custom_op would overwrite the first definition, and the project's next call of
the op reached a freed operator (std::bad_alloc or a segmentation fault, at random)."""

import sys
import textwrap

import launch

CHECK = textwrap.dedent("""
    import gc, importlib.util, sys
    import torch
    from torch._library.custom_ops import OPDEFS
    from nanochat.connections.backends import liger, ops

    names = [q for q in OPDEFS if q.startswith("nanochat::")]
    before = {q: OPDEFS[q] for q in names}
    assert "nanochat::project" in before and "nanochat::liger_mix_pre" in before, names
    # a second copy of both modules, under other names, as transformers loads an export
    for module in (liger, ops):
        spec = importlib.util.spec_from_file_location("exported_copy_" + module.__name__.split(".")[-1],
                                                      module.__file__)
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
        del copy
    gc.collect()
    changed = [q for q in names if OPDEFS[q] is not before[q]]
    assert not changed, f"redefined: {changed}"
    x, w = torch.randn(8, 32, dtype=torch.float64), torch.randn(32, 5, dtype=torch.float64, requires_grad=True)
    for _ in range(50):
        xw, ss = ops.project(x, w)
        xw.sum().backward()
    assert torch.allclose(xw, x @ w) and torch.allclose(ss, x.square().mean(-1, keepdim=True))
    print("ok")
""")


def test_a_second_copy_of_the_modules_keeps_the_first_definitions():
    result = launch.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr[-3000:]
