"""The offline text: English found on every machine with Python (the standard library's
docstrings and comments, its compiled modules' docstrings, the reference manual's help
topics), collected in a fixed order so that the corpus is deterministic."""

import ast
import importlib
import importlib.machinery
import importlib.util
import inspect
import io
import os
import sys
import sysconfig
import tokenize
import warnings


def _arg_names(fn):
    """`(a, b, *args, key, **kw)` without defaults or annotations, whose reprs can hold
    machine-specific values (addresses, paths) that would make the corpus non-deterministic."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        names.append("*")
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return "(" + ", ".join(names) + ")"


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _definitions(node):
    """`node` and the classes and functions nested in it, following statement bodies only
    (much cheaper than ast.walk, which visits every expression)."""
    yield node
    stack = [node]
    while stack:
        stmt = stack.pop()
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(stmt, field, ()):
                if isinstance(child, _DEFS):
                    yield child
                if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                    stack.append(child)


def _source_documents(path, module):
    """Documents of one stdlib source file, read with ast/tokenize (never imported, so no
    module side effects): one for the module docstring and top-level comments, one per
    top-level class or function with the docstrings and comments inside it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        src = f.read()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    pieces, spans = {}, []  # top-level line (0 = module) -> [(line, text, is_docstring)]
    doc = ast.get_docstring(tree)
    if doc:
        pieces[0] = [(0, doc, True)]
    for node in tree.body:
        if not isinstance(node, _DEFS):
            continue
        spans.append((node.lineno, node.end_lineno))
        for sub in _definitions(node):
            doc = ast.get_docstring(sub)
            if doc:
                head = f"class {sub.name}" if isinstance(sub, ast.ClassDef) else f"def {sub.name}{_arg_names(sub)}"
                pieces.setdefault(node.lineno, []).append((sub.lineno, f"{head}\n{doc}", True))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                line = tok.start[0]
                owner = next((s for s, e in spans if s <= line <= e), 0)
                pieces.setdefault(owner, []).append((line, tok.string.lstrip("#").strip(), False))
    except (tokenize.TokenError, SyntaxError):
        pass
    docs = []
    for owner in sorted(pieces):
        blocks, prev = [], None
        for line, text, is_doc in sorted(pieces[owner], key=lambda p: p[0]):
            if not is_doc and prev == line - 1 and blocks and not blocks[-1][1]:
                blocks[-1][0].append(text)  # consecutive comment lines form one paragraph
            else:
                blocks.append(([text], is_doc))
            prev = None if is_doc else line
        body = "\n\n".join("\n".join(lines).strip() for lines, _ in blocks if "".join(lines).strip())
        if len(body) >= 40:
            docs.append(f"{module}\n\n{body}")
    return docs


def _compiled_module_documents(name):
    """Docstrings of a C module (math, itertools, sys...): these need an import, which for
    compiled stdlib modules runs no Python code."""
    module = importlib.import_module(name)
    members = vars(module)
    parts = [inspect.cleandoc(module.__doc__)] if isinstance(module.__doc__, str) else []
    for key, value in sorted(members.items()):
        if key.startswith("_"):
            continue
        # sys keeps the original of each hook a program may replace (pytest replaces
        # sys.unraisablehook) as __hook__: document that, whatever the process did.
        original = members.get(f"__{key}__")
        value = original if inspect.isroutine(original) else value
        if not (inspect.isroutine(value) or inspect.isclass(value)):
            continue
        if getattr(value, "__module__", name) != name or not isinstance(value.__doc__, str):
            continue
        parts.append(f"{name}.{key}\n{inspect.cleandoc(value.__doc__)}")
    return [f"{name}\n\n" + "\n\n".join(parts)] if parts else []


_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_SKIP_COMPILED = {"readline"}  # importing it may write terminal control codes


def collect_python_docs():
    """English text found on every machine with Python, in a fixed order: the stdlib's
    docstrings and comments (from source), the docstrings of its compiled modules, and the
    help topics of the reference manual (pydoc_data). Identical documents appear once."""
    root = sysconfig.get_paths()["stdlib"]
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for fname in sorted(f for f in filenames if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(dirpath, fname), root)[:-3]
            module = rel.replace(os.sep, ".").removesuffix(".__init__")
            docs += _source_documents(os.path.join(dirpath, fname), module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules (audioop, nis...) warn on import
        for name in sorted(sys.stdlib_module_names):
            if name.startswith("_") or name in _SKIP_COMPILED:
                continue
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec else None
            if origin == "built-in" or (origin or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                try:
                    docs += _compiled_module_documents(name)
                except ImportError:
                    continue
        from pydoc_data.topics import topics
    docs += [f"Python help: {key}\n\n{topics[key].strip()}" for key in sorted(topics)]
    seen = set()
    return [d for d in docs if not (d in seen or seen.add(d))]

