"""Every CuPy name ember-cupy calls exists in the installed CuPy: the code cannot run here (no GPU), so its
attribute chains are checked statically, by walking each module's AST.

Roots: the names ``cupy``/``cp``/``cupyx``, ``self.cp``, and locals assigned from a chain (``rt =
cupy.cuda.runtime``). ``self.pool``/``self.stream``/``self.device`` are a MemoryPool, a Stream and a Device; methods
called on array handles (``h.astype``) must be ``cupy.ndarray`` methods.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

cupy = pytest.importorskip("cupy")

SRC = pathlib.Path(importlib.import_module("ember_cupy").__file__).parent
MODULES = ["backend.py", "detect.py", "rtc.py"]
#: instance attributes of CuPyBackend and the CuPy classes they hold
MEMBERS = {"pool": cupy.cuda.MemoryPool, "stream": cupy.cuda.Stream, "device": cupy.cuda.Device}
#: local names that hold cupy arrays in backend.py
HANDLES = {"h", "a", "b", "r", "idx", "rev", "out", "dst", "src", "op"}


def _chain(node: ast.AST) -> list[str] | None:
    """['cp', 'cuda', 'runtime', 'getDeviceCount'] for cp.cuda.runtime.getDeviceCount, None for other shapes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def _references(path: pathlib.Path) -> list[tuple[int, str, object, list[str]]]:
    """(line, text, root object, attribute path) for every cupy chain in the module."""
    tree = ast.parse(path.read_text())
    aliases: dict[str, list[str]] = {}
    for node in ast.walk(tree):  # rt = cupy.cuda.runtime / cp = self.cp / cupy = _cupy()
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            chain = _chain(node.value)
            if chain and chain[0] in ("cupy", "cp") and len(chain) > 1:
                aliases[node.targets[0].id] = ["cupy", *chain[1:]]
    refs = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or isinstance(getattr(node, "parent", None), ast.Attribute):
            continue
        chain = _chain(node)
        if not chain:
            continue
        text = ".".join(chain)
        head, rest = chain[0], chain[1:]
        if head == "self" and rest[:1] == ["cp"]:
            refs.append((node.lineno, text, cupy, rest[1:]))
        elif head == "self" and rest[:1] and rest[0] in MEMBERS and len(rest) > 1:
            refs.append((node.lineno, text, MEMBERS[rest[0]], rest[1:]))
        elif head in ("cupy", "cp"):
            refs.append((node.lineno, text, cupy, rest))
        elif head == "cupyx":
            refs.append((node.lineno, text, importlib.import_module("cupyx"), rest))
        elif head in aliases:
            refs.append((node.lineno, text, cupy, aliases[head][1:] + rest))
        elif head in HANDLES and path.name == "backend.py" and len(rest) == 1:
            refs.append((node.lineno, text, cupy.ndarray, rest))
    return refs


def _mark_parents(tree: ast.AST) -> None:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent  # type: ignore[attr-defined]


def _resolve(root: object, path: list[str]) -> bool:
    obj = root
    for name in path:
        if not hasattr(obj, name):
            # submodules load on import (cupy.cuda.memory), not on attribute access
            if isinstance(obj, type(cupy)):
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{name}")
                    continue
                except ImportError:
                    return False
            return False
        obj = getattr(obj, name)
    return True


@pytest.mark.parametrize("module", MODULES)
def test_every_cupy_name_exists(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SRC / module
    original = ast.parse

    def parse_with_parents(source: str, *args: object, **kwargs: object) -> ast.AST:
        tree = original(source, *args, **kwargs)
        _mark_parents(tree)
        return tree

    monkeypatch.setattr(ast, "parse", parse_with_parents)
    refs = _references(path)
    missing = [f"{module}:{line}: {text}" for line, text, root, attrs in refs if attrs and not _resolve(root, attrs)]
    assert not missing, "names the installed CuPy lacks:\n" + "\n".join(missing)
    if module == "backend.py":  # the walk found the calls it is meant to check
        names = {text for _, text, _, _ in refs}
        assert {"cp.matmul", "self.cp.RawModule", "self.pool.used_bytes", "self.stream.synchronize"} <= names


def test_walk_catches_a_missing_name(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a misspelt CuPy function is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import cupy\n\ndef f(x):\n    cp = cupy\n    return cp.matmull(x, x) + cupy.cuda.runtime.nope()\n")
    original = ast.parse

    def parse_with_parents(source: str, *args: object, **kwargs: object) -> ast.AST:
        tree = original(source, *args, **kwargs)
        _mark_parents(tree)
        return tree

    monkeypatch.setattr(ast, "parse", parse_with_parents)
    refs = _references(bad)
    missing = sorted(text for _, text, root, attrs in refs if attrs and not _resolve(root, attrs))
    assert missing == ["cp.matmull", "cupy.cuda.runtime.nope"]


def _accepts(fn: object, keyword: str) -> bool:
    """Whether callable fn takes ``keyword``: its signature, or for Cython functions the signature line of its
    docstring (CuPy's compiled functions have no inspectable signature)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        head = (getattr(fn, "__doc__", "") or "").split("\n\n")[0]
        return keyword in head
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def test_keywords_passed_to_cupy_exist() -> None:
    """``cp.sum(h, axis=..., keepdims=...)``: every keyword given to a CuPy function is one it takes."""
    tree = ast.parse((SRC / "backend.py").read_text())
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.keywords:
            continue
        chain = _chain(node.func)
        if not chain:
            continue
        if chain[:2] == ["self", "cp"]:
            path = chain[2:]
        elif chain[0] == "cp":
            path = chain[1:]
        else:
            continue
        obj: object = cupy
        for name in path:
            obj = getattr(obj, name)
        for kw in node.keywords:
            if kw.arg and not _accepts(obj, kw.arg):
                bad.append(f"backend.py:{node.lineno}: {'.'.join(chain)}({kw.arg}=...)")
    assert not bad, "keywords the installed CuPy does not take:\n" + "\n".join(bad)
