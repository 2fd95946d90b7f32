"""Every CuPy name ember-cupy calls exists in the installed CuPy: the code cannot run here (no GPU), so its
attribute chains are checked statically, by walking each module's AST.

Roots: the names ``cupy``/``cp``/``cupyx``, ``self.cp`` (``be.cp`` in the modules that take the backend as
``be``), and locals assigned from a chain (``rt = cupy.cuda.runtime``). ``self.pool``/``self.stream``/``self.device``
(and a local ``pool``) are a MemoryPool, a Stream and a Device; attributes of array handles (``h.astype``,
``x.strides``) must be ``cupy.ndarray``'s.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

cupy = pytest.importorskip("cupy")

SRC = pathlib.Path(importlib.import_module("ember_cupy").__file__).parent
MODULES = ["backend.py", "detect.py", "rtc.py", "kernels.py", "memory.py"]
#: instance attributes of CuPyBackend and the CuPy classes they hold
MEMBERS = {"pool": cupy.cuda.MemoryPool, "stream": cupy.cuda.Stream, "device": cupy.cuda.Device}
#: local names that hold cupy arrays, per module
HANDLES = {"backend.py": {"h", "a", "b", "r", "idx", "rev", "out", "dst", "src", "op"},
           "kernels.py": {"h", "x", "w", "b", "out", "idx", "index", "cols", "dcols", "s", "src", "hv", "xv", "dst",
                          "y", "gy", "grad_y", "gw", "bias", "a"}}
#: local names that hold a cupy.cuda.MemoryPool
POOLS = {"pool"}


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
        if head in ("self", "be") and rest[:1] == ["cp"]:
            refs.append((node.lineno, text, cupy, rest[1:]))
        elif head in ("self", "be") and rest[:1] and rest[0] in MEMBERS and len(rest) > 1:
            refs.append((node.lineno, text, MEMBERS[rest[0]], rest[1:]))
        elif head in POOLS and len(rest) == 1:
            refs.append((node.lineno, text, cupy.cuda.MemoryPool, rest))
        elif head in ("cupy", "cp"):
            refs.append((node.lineno, text, cupy, rest))
        elif head == "cupyx":
            refs.append((node.lineno, text, importlib.import_module("cupyx"), rest))
        elif head in aliases:
            refs.append((node.lineno, text, cupy, aliases[head][1:] + rest))
        elif head in HANDLES.get(path.name, ()) and len(rest) == 1:
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
    names = {text for _, text, _, _ in refs}
    if module == "backend.py":  # the walk found the calls it is meant to check
        assert {"cp.matmul", "self.cp.RawModule", "self.pool.used_bytes", "self.stream.synchronize", "out.set",
                "cupyx.empty_pinned", "self.stream.record", "cp.asnumpy"} <= names
    if module == "kernels.py":
        assert {"be.cp.take_along_axis", "h.strides", "x.shape", "cp.arange"} <= names
    if module == "memory.py":
        assert {"cp.cuda.MemoryHook", "pool.free_all_blocks", "pool.malloc", "pool.total_bytes"} <= names


def test_memory_hook_methods_and_pinned_pool_exist() -> None:
    """The dry run's hook overrides CuPy's hook methods by name (a misspelt one would silently never be called),
    and the pinned pool the report reads is CuPy's."""
    import inspect

    from ember_cupy import memory

    overrides = set(re.findall(r"def (\w+process)\(", inspect.getsource(memory)))
    assert overrides == {"malloc_postprocess", "free_postprocess"}
    assert all(hasattr(cupy.cuda.MemoryHook, m) for m in overrides)
    assert hasattr(cupy.get_default_pinned_memory_pool(), "n_free_blocks")
    assert hasattr(cupy.cuda.Event, "done")


def test_cudnn_is_used_only_where_cupy_has_it() -> None:
    """The cuDNN path calls ``cupyx.cudnn.convolution_forward``; CuPy 14 removed cuDNN, so there the probe must say
    None (every conv goes through im2col + cuBLAS); where CuPy has the module, the function must exist."""
    import importlib.util

    from ember_cupy import kernels

    if importlib.util.find_spec("cupyx.cudnn") is None:
        assert kernels.cudnn_module() is None
    else:
        assert hasattr(importlib.import_module("cupyx.cudnn"), "convolution_forward")


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


@pytest.mark.parametrize("module", ["backend.py", "kernels.py"])
def test_keywords_passed_to_cupy_exist(module: str) -> None:
    """``cp.sum(h, axis=..., keepdims=...)``: every keyword given to a CuPy function is one it takes."""
    tree = ast.parse((SRC / module).read_text())
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.keywords:
            continue
        chain = _chain(node.func)
        if not chain:
            continue
        root: object = cupy
        if chain[:2] in (["self", "cp"], ["be", "cp"]):
            path = chain[2:]
        elif chain[0] == "cp":
            path = chain[1:]
        elif chain[0] == "cupyx":
            root, path = importlib.import_module("cupyx"), chain[1:]
        else:
            continue
        obj = root
        for name in path:
            obj = getattr(obj, name)
        for kw in node.keywords:
            if kw.arg and not _accepts(obj, kw.arg):
                bad.append(f"{module}:{node.lineno}: {'.'.join(chain)}({kw.arg}=...)")
    assert not bad, "keywords the installed CuPy does not take:\n" + "\n".join(bad)
