"""The exported model's Python code, assembled from the project's own modules at export time.

A Hugging Face directory loaded with `trust_remote_code` must carry every module its model
needs, as flat files side by side: transformers copies them into a package of its own and
imports them there, so the project need not be installed. A second, hand-written copy of
the model would drift from the one that trained it; instead the entry modules (the
configuration and modeling wrappers of this package) and every module of `nanochat` they
import, transitively, are copied unchanged but for their imports of `nanochat`, which
become relative:

    from nanochat.gpt import GPT              ->  from .gpt import GPT
    from nanochat.connections import hc       ->  from . import connections_hc as hc
    from nanochat import connections          ->  from . import connections

A module's flat name is its dotted name without the package, dots turned into underscores
(`nanochat.connections.hc` -> `connections_hc.py`), unless `names` gives it another (the
wrappers' `configuration_<type>.py` / `modeling_<type>.py`).

transformers' loader finds the files to copy (or to download from the Hub) by scanning for
`from .name import` lines and does not follow `from . import name` (a module object): each
such import is followed by a `from .name import __name__` line that names the file.
A package that finds its submodules at import time (the connections' registry lists its
package) has no package to list in the flat copy: `discovered` names, per such module, the
submodules it found, and they are written into its flat file as plain imports after its own.
`check_imports` refuses a file importing anything but torch, transformers and the standard
library: the loader refuses to load a file whose imports are missing, even a lazy one.
"""

import ast
import importlib.util
import sys
from pathlib import Path

PACKAGE = "nanochat"
# What a user of the exported model has besides the standard library.
ALLOWED_IMPORTS = {"torch", "transformers"}


class AssemblyError(ValueError):
    pass


def _is_package(module):
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def _is_module(name):
    """Whether a dotted name is a submodule (rather than an attribute) of its parent."""
    parent = name.rpartition(".")[0]
    return _is_package(parent) and importlib.util.find_spec(name) is not None


def _source(module):
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise AssemblyError(f"cannot find the Python source of module {module}")
    return Path(spec.origin)


def _absolute(node, module):
    """The absolute module an ImportFrom node imports from (relative ones resolved)."""
    if node.level == 0:
        return node.module
    package = module if _is_package(module) else module.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def flat_name(module, package=PACKAGE, names=None):
    if names and module in names:
        return names[module]
    return module.removeprefix(package + ".").replace(".", "_")


def _ours(name, package):
    return name == package or name.startswith(package + ".")


def _relative_imports(node, base, package, names):
    """The statements that replace one `from <base> import ...` of ours, and the modules of
    ours they need: one import of the attributes from base's file, then one (plus the line
    for transformers' loader) per submodule imported as a module object."""
    lines, needed = [], []
    submodules = {a.name: f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")}
    attributes = [a for a in node.names if a.name not in submodules]
    if attributes:
        listed = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in attributes)
        lines.append(f"from .{flat_name(base, package, names)} import {listed}")
        needed.append(base)
    for alias in node.names:
        if alias.name in submodules:
            module = submodules[alias.name]
            flat, bound = flat_name(module, package, names), alias.asname or alias.name
            lines.append(f"from . import {flat}" + ("" if flat == bound else f" as {bound}"))
            lines.append(f"from .{flat} import __name__ as _  # names {flat}.py for transformers' loader")
            needed.append(module)
    return lines, needed


def _module_object_imports(modules, package, names):
    """The lines that import each of `modules` (submodules of one package) as a module object
    bound to its own name, as _relative_imports writes them."""
    lines = []
    for module in modules:
        flat, bound = flat_name(module, package, names), module.rpartition(".")[2]
        lines.append(f"from . import {flat}" + ("" if flat == bound else f" as {bound}") + "\n")
        lines.append(f"from .{flat} import __name__ as _  # names {flat}.py for transformers' loader\n")
    return lines


def rewrite(module, package=PACKAGE, names=None, discovered=None):
    """(module's source with its imports of `package` made relative, the modules of the
    package it imports); `discovered` (the submodules it finds at import time) become plain
    imports after its last top-level import."""
    path = _source(module)
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    needed, replacements = [], []
    tree = ast.parse(source, filename=str(path))
    if discovered:
        last = max(node.end_lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))
        replacements.append((last, last - 1, _module_object_imports(discovered, package, names)))
        needed += discovered
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(_ours(a.name, package) for a in node.names):
            raise AssemblyError(f"{path}:{node.lineno}: `import {node.names[0].name}` cannot be exported; write it "
                                f"as `from {package}... import ...`")
        if not isinstance(node, ast.ImportFrom):
            continue
        base = _absolute(node, module)
        if not _ours(base, package):
            continue
        start, end = node.lineno - 1, node.end_lineno - 1
        indent, rest = lines[start][:node.col_offset], lines[end][node.end_col_offset:]
        if indent.strip() or rest.split("#")[0].strip():
            raise AssemblyError(f"{path}:{node.lineno}: put this import on lines of its own to export it")
        new, imported = _relative_imports(node, base, package, names)
        replacements.append((start, end, [indent + line + "\n" for line in new]))
        needed += imported
    for start, end, new in sorted(replacements, reverse=True):
        lines[start:end + 1] = new
    return "".join(lines), needed


def assemble(entries, out_dir, package=PACKAGE, names=None, discovered=None):
    """Write the entry modules and every module of `package` they import, transitively,
    into out_dir as flat files; `discovered`: {module: [submodules it finds at import time]}.
    Returns {file name: module}."""
    written, queue = {}, list(entries)
    while queue:
        module = queue.pop(0)
        if module in written.values():
            continue
        file_name = flat_name(module, package, names) + ".py"
        if file_name in written:
            raise AssemblyError(f"{module} and {written[file_name]} would both be exported as {file_name}")
        source, needed = rewrite(module, package, names, (discovered or {}).get(module))
        (Path(out_dir) / file_name).write_text(source, encoding="utf-8")
        written[file_name] = module
        queue += needed
    return written


def check_imports(out_dir, files):
    """Raise AssemblyError unless the files import only what a user of the exported model
    has: torch, transformers and the standard library."""
    from transformers.dynamic_module_utils import get_imports

    for name in files:
        extra = sorted(set(get_imports(Path(out_dir) / name)) - ALLOWED_IMPORTS - set(sys.stdlib_module_names))
        if extra:
            raise AssemblyError(f"{name} imports {', '.join(extra)}, which a user of the exported model may not "
                                "have: import it lazily (importlib.import_module) or inside a try block")
