"""Imports go one way (docs/architecture.md, "Where each job lives"): read from the source, a
top-level module or package of nanochat at a time, the imports among them form no cycle (a
lower floor that imports a higher one closes one); nothing of nanochat imports a script; and
the connections import nothing of the project but `common`, `flags` and the leaf modules
`trunks`, `gpus` and `measurements` (an export carries what the model imports)."""

import ast
from pathlib import Path

NANOCHAT = Path(__file__).resolve().parent.parent / "nanochat"


def unit(module):
    """The top-level module or package of nanochat a dotted name belongs to (None: nanochat itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports(path):
    """Dotted names a file imports, anywhere in it (a function's deferred import counts too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from nanochat import x` imports nanochat.x
            found += [f"{node.module}.{a.name}" for a in node.names] if node.module == "nanochat" else [node.module]
    return found


def unit_graph():
    """{unit: {units it imports}} over every file of nanochat."""
    graph = {}
    for path in NANOCHAT.rglob("*.py"):
        parts = path.relative_to(NANOCHAT).with_suffix("").parts
        here = parts[0] if parts[0] != "__init__" else None
        for name in imports(path):
            if name.startswith("nanochat.") and unit(name) not in (here, None):
                graph.setdefault(here, set()).add(unit(name))
    return graph


def cycle(graph):
    """One import cycle as a list of units, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph, key=str):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_imports_form_no_cycle():
    assert cycle(unit_graph()) is None, " -> ".join(map(str, cycle(unit_graph())))


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}}) is None


def test_nothing_imports_a_script_and_the_connections_import_only_common_flags_and_trunks():
    """trunks.py: the trunk names a config carries; gpus.py: the GPU table (common's MFU reads it,
    so an export carries it); measurements.py: the committed measurements `auto` (backends/)
    chooses by. Leaf modules: they import no other (measurements, gpus alone)."""
    assert not [n for n in imports(NANOCHAT / "trunks.py") if n.startswith("nanochat")]
    assert not [n for n in imports(NANOCHAT / "gpus.py") if n.startswith("nanochat")]
    assert {n for n in imports(NANOCHAT / "measurements.py") if n.startswith("nanochat")} == {"nanochat.gpus"}
    for path in NANOCHAT.rglob("*.py"):
        names = imports(path)
        assert not [n for n in names if n == "scripts" or n.startswith("scripts.")], path
        if path.relative_to(NANOCHAT).parts[0] == "connections":
            outside = {unit(n) for n in names if n.startswith("nanochat.")} - {"connections", "common", "flags",
                                                                                 "trunks", "gpus", "measurements"}
            assert not outside, (path, outside)
