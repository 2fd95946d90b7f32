"""Architecture invariants, checked on the source tree with ``ast`` (nothing here imports a plugin or runs code).

* No plugin imports another plugin, in its package or its tests: plugins meet only through core's contract, and a
  test that needs another plugin's device asks for it by device string (a fixture), never by import.
* Core names no plugin: nothing under ``packages/ember-core/src`` imports a plugin package, and no string literal
  in its code (docstrings and comments aside) equals a plugin's package, distribution, entry-point or registered
  device/decorator name. Core finds backends through the plugin registry only.
* The module-level imports between core modules form no cycle (imports inside functions and ``if TYPE_CHECKING:``
  blocks run later or never, so they do not count).
* ``ember.shapes`` is a leaf: it imports nothing from ember except ``ember.errors``.

Every scanner is a function of a root path, so the tests below also check that each one catches a planted
violation in a small fake tree.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"
CORE_SRC = ROOT / "packages" / "ember-core" / "src"
CORE_PACKAGE = "ember"

#: hook functions whose ``register(name, ...)`` calls declare device kinds / decorator names
_REGISTER_HOOKS = frozenset({"register_backends", "register_decorators"})
#: directories never scanned (build outputs, caches, virtual environments)
_SKIP_DIRS = frozenset({"__pycache__", "build", "dist", ".venv", ".nox", ".tox", "node_modules"})


# ------------------------------------------------------------------------------------------------------------------
# source walking
# ------------------------------------------------------------------------------------------------------------------
def _py_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        if not _SKIP_DIRS.intersection(path.relative_to(root).parts) and not any(
            p.endswith(".egg-info") for p in path.relative_to(root).parts
        ):
            yield path


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _resolve_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name of ``from <node.module> import ...`` written in ``module``."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _absolute_imports(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an absolute import names (``import a.b, c``: a.b and c; ``from a.b import c``: a.b); a relative
    import stays inside its own package and gives none."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""] if not node.level else []


def _dependencies(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, mods: Iterable[str]) -> set[str]:
    """The modules of mods an import statement in module needs: ``from a import b, c`` needs a.b and a.c where
    those are modules, and a itself when any imported name is not a submodule (a's __init__ defines it)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in mods}
    base = _resolve_from(node, module, is_package)
    subs = {f"{base}.{alias.name}" for alias in node.names}
    deps = subs & set(mods)
    if deps != subs and base in mods:
        deps.add(base)
    return deps


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements executed when the module is imported: everything outside function bodies (class bodies
    and if/try/with/loop blocks run at import time), except ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.stmt] = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(reversed(node.orelse))
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in reversed(getattr(node, field, []) or []):
                    if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                        stack.extend(reversed(child.body))
                    elif isinstance(child, ast.stmt):
                        stack.append(child)


def _all_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _docstring_nodes(tree: ast.Module) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class and function)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                first.value.value, str
            ):
                out.add(id(first.value))
    return out


def _code_strings(tree: ast.Module) -> Iterator[ast.Constant]:
    """String constants in code: docstrings excluded (comments never reach the AST)."""
    skip = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node


# ------------------------------------------------------------------------------------------------------------------
# plugins
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plugin:
    """One distribution under plugins/: where it lives and every name that identifies it."""

    root: Path
    distribution: str
    packages: frozenset[str]  #: import packages under src/
    registered: frozenset[str]  #: entry-point names and the names its register_* hooks register

    @property
    def names(self) -> frozenset[str]:
        return self.packages | self.registered | {self.distribution}


def _registered_names(src: Path) -> set[str]:
    """The first argument (or ``name=``) of every ``register(...)`` call inside a register_backends /
    register_decorators hook under src."""
    names: set[str] = set()
    for path in _py_files(src):
        for fn in ast.walk(_parse(path)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name not in _REGISTER_HOOKS:
                continue
            register = fn.args.args[-1].arg if fn.args.args else "register"
            for call in ast.walk(fn):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == register):
                    continue
                args = list(call.args[:1]) + [k.value for k in call.keywords if k.arg == "name"]
                names.update(a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def discover_plugins(plugins_root: Path) -> list[Plugin]:
    """Every distribution (a pyproject.toml with a src/ dir) under plugins_root."""
    found = []
    for pyproject in sorted(plugins_root.rglob("pyproject.toml")):
        dist_root = pyproject.parent
        src = dist_root / "src"
        if not src.is_dir() or _SKIP_DIRS.intersection(dist_root.relative_to(plugins_root).parts):
            continue
        packages = frozenset(p.name for p in src.iterdir() if (p / "__init__.py").is_file())
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        entry_points = project.get("entry-points", {}).get(CORE_PACKAGE, {})
        registered = frozenset(set(entry_points) | _registered_names(src))
        found.append(Plugin(dist_root, project.get("name", dist_root.name), packages, registered))
    return found


def cross_plugin_imports(plugins_root: Path) -> list[str]:
    """'file:line imports X (plugin Y)' for every import of another plugin's package from inside a plugin's
    distribution (its package, tests, conftest, examples)."""
    plugins = discover_plugins(plugins_root)
    owner = {pkg: p for p in plugins for pkg in p.packages}
    bad = []
    for plugin in plugins:
        for path in _py_files(plugin.root):
            for node in _all_imports(_parse(path)):
                for name in _absolute_imports(node):
                    other = owner.get(name.split(".")[0])
                    if other is not None and other is not plugin:
                        bad.append(f"{path.relative_to(plugins_root)}:{node.lineno} imports {name} "
                                   f"(plugin {other.distribution})")
    return bad


def _install_hint_strings(tree: ast.Module) -> set[int]:
    """ids of the strings in an ``INSTALL_HINT_EXTRAS = ...`` table: extras named in messages, never looked up."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("INSTALL_HINT_EXTRAS")
                                                for t in node.targets):
            found.update(id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return found


def core_plugin_mentions(core_src: Path, plugins_root: Path) -> list[str]:
    """'file:line ...' for every import of a plugin package and every code string literal equal to a plugin's
    name under core_src."""
    plugins = discover_plugins(plugins_root)
    # core's own modules keep their names when a plugin extends them (the open namespace ember.linalg)
    own_modules = {m.stem for pkg in core_src.iterdir() if pkg.is_dir() for m in pkg.iterdir()
                   if m.suffix == ".py" or (m / "__init__.py").is_file()}
    owner = {name: p for p in plugins for name in p.names if name not in own_modules}
    packages = {pkg for p in plugins for pkg in p.packages}
    bad: set[tuple[Path, int, str]] = set()  # a set: a line may hold the same literal twice
    for path in _py_files(core_src):
        tree = _parse(path)
        rel = path.relative_to(core_src)
        for node in _all_imports(tree):
            bad.update((rel, node.lineno, f"imports plugin package {n}") for n in _absolute_imports(node)
                       if n.split(".")[0] in packages)
        hints = _install_hint_strings(tree)
        for const in _code_strings(tree):
            if const.value in owner and id(const) not in hints:
                bad.add((rel, const.lineno, f"names plugin {owner[const.value].distribution} with the literal "
                                            f"{const.value!r}"))
    return [f"{rel}:{line} {what}" for rel, line, what in sorted(bad)]


# ------------------------------------------------------------------------------------------------------------------
# core's import graph
# ------------------------------------------------------------------------------------------------------------------
def _core_modules(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is_package) for every module of package under src."""
    mods = {}
    for path in _py_files(src / package):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        mods[".".join(parts)] = (path, is_pkg)
    return mods


def import_graph(src: Path, package: str = CORE_PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports at module level.

    Importing a.b.c also runs the __init__ of a.b, so that package counts too, unless it encloses the importing
    module (then it is already being imported). The top-level package itself is left out as a target for the same
    reason: every module of it runs inside its import.
    """
    mods = _core_modules(src, package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        parts = name.split(".")
        enclosing = {".".join(parts[:i]) for i in range(1, len(parts))}
        edges: set[str] = set()
        for node in _module_level_imports(_parse(path)):
            for target in _dependencies(node, name, is_pkg, mods):
                tparts = target.split(".")
                edges.update(".".join(tparts[:i]) for i in range(1, len(tparts) + 1))
        graph[name] = {e for e in edges if e in mods and e != name and e != package and e not in enclosing}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of graph as a path [a, b, ..., a], or None when it is acyclic (iterative DFS, sorted order so
    the report is stable)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        path = [start]
        colour[start] = GREY
        iters = [iter(sorted(graph[start]))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                iters.pop()
            elif colour.get(nxt, BLACK) == GREY:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt) == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


def function_level_imports(src: Path, package: str = CORE_PACKAGE) -> list[str]:
    """'module:line' of every import of the package's own modules made inside a function (deferred imports)."""
    mods = _core_modules(src, package)
    out = []
    for name, (path, is_pkg) in mods.items():
        tree = _parse(path)
        not_deferred = {id(n) for n in _module_level_imports(tree)} | {
            id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
            for stmt in block.body for n in ast.walk(stmt)
        }
        out += [f"{name}:{node.lineno}" for node in _all_imports(tree)
                if id(node) not in not_deferred and _dependencies(node, name, is_pkg, mods)]
    return out


def module_imports_from(src: Path, module: str, package: str = CORE_PACKAGE) -> set[str]:
    """The package's modules a module imports anywhere (module level, in functions, under TYPE_CHECKING)."""
    mods = _core_modules(src, package)
    path, is_pkg = mods[module]
    return {dep for node in _all_imports(_parse(path)) for dep in _dependencies(node, module, is_pkg, mods)}


# ------------------------------------------------------------------------------------------------------------------
# the invariants
# ------------------------------------------------------------------------------------------------------------------
def test_the_plugins_are_found() -> None:
    plugins = {p.distribution: p for p in discover_plugins(PLUGINS)}
    assert {"ember-flex", "ember-opencl", "ember-autodiff", "ember-fusion"} <= set(plugins)
    assert plugins["ember-flex"].packages == {"ember_flex"}
    assert {"flex"} <= plugins["ember-flex"].registered
    assert {"fusion"} <= plugins["ember-fusion"].registered
    assert {"autodiff"} <= plugins["ember-autodiff"].registered
    assert {"opencl"} <= plugins["ember-opencl"].registered


def test_no_plugin_imports_another_plugin() -> None:
    bad = cross_plugin_imports(PLUGINS)
    assert not bad, "plugins must meet only through core (use a device-string fixture, not an import):\n" + (
        "\n".join(bad))


def test_core_names_no_plugin() -> None:
    bad = core_plugin_mentions(CORE_SRC, PLUGINS)
    assert not bad, "core must find plugins through the registry, never by name:\n" + "\n".join(bad)


def test_core_modules_import_without_cycles() -> None:
    cycle = find_cycle(import_graph(CORE_SRC))
    assert cycle is None, "module-level import cycle in core: " + " -> ".join(cycle or [])


def test_shapes_is_a_leaf() -> None:
    assert module_imports_from(CORE_SRC, "ember.shapes") <= {"ember.errors"}


# ------------------------------------------------------------------------------------------------------------------
# the scanners catch planted violations
# ------------------------------------------------------------------------------------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _fake_plugin(where: str, package: str, kind: str, hook: str = "register_backends") -> dict[str, str]:
    dist = where.split("/")[-1]
    return {
        f"{where}/pyproject.toml": f'[project]\nname = "{dist}"\n[project.entry-points.ember]\n{kind} = '
                                   f'"{package}.plugin"\n',
        f"{where}/src/{package}/__init__.py": "",
        f"{where}/src/{package}/plugin.py": f"def {hook}(register):\n    register({kind!r}, object)\n",
    }


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    _write(tmp_path / "plugins", {**_fake_plugin("backends/ember-a", "ember_a", "alpha"),
                                  **_fake_plugin("decorators/ember-b", "ember_b", "beta", "register_decorators")})
    _write(tmp_path / "src", {"core/__init__.py": "", "core/errors.py": "", "core/shapes.py": "from . import errors\n",
                              "core/x.py": '"""Mentions alpha and ember_a in the docstring."""\n# alpha\n'})
    return tmp_path


def test_discovery_reads_packages_entry_points_and_registrations(fake_tree: Path) -> None:
    a, b = discover_plugins(fake_tree / "plugins")
    assert (a.distribution, a.packages, a.registered) == ("ember-a", {"ember_a"}, {"alpha"})
    assert b.names == {"ember-b", "ember_b", "beta"}


@pytest.mark.parametrize("where", ["src/ember_a/mod.py", "tests/test_x.py", "tests/conftest.py"])
@pytest.mark.parametrize("stmt", ["import ember_b", "from ember_b.plugin import x", "import ember_b.plugin as p",
                                  "def f():\n    import ember_b\n"], ids=["import", "from", "as", "deferred"])
def test_a_planted_cross_plugin_import_is_found(fake_tree: Path, where: str, stmt: str) -> None:
    plugins = fake_tree / "plugins"
    assert cross_plugin_imports(plugins) == []
    _write(plugins / "backends/ember-a", {where: stmt + "\n"})
    (found,) = cross_plugin_imports(plugins)
    assert "ember_b" in found and "plugin ember-b" in found and where.split("/")[-1] in found


def test_a_plugin_may_import_itself_and_core(fake_tree: Path) -> None:
    plugins = fake_tree / "plugins"
    _write(plugins / "backends/ember-a", {"tests/test_x.py": "import ember_a\nfrom ember_a import plugin\n"
                                                             "import core\nfrom . import helpers\n"})
    assert cross_plugin_imports(plugins) == []


@pytest.mark.parametrize("code, what", [
    ("import ember_a\n", "imports plugin package ember_a"),
    ("def f():\n    from ember_b.plugin import x\n", "imports plugin package ember_b.plugin"),
    ("KIND = 'alpha'\n", "literal 'alpha'"),
    ("def f(d):\n    return d.kind == 'beta'\n", "literal 'beta'"),
    ("import importlib\nm = importlib.import_module('ember_a')\n", "literal 'ember_a'"),
    ("HINT = {'ember-b': 1}\n", "literal 'ember-b'"),
], ids=["import", "deferred-import", "constant", "comparison", "import_module", "distribution"])
def test_a_planted_core_mention_is_found(fake_tree: Path, code: str, what: str) -> None:
    src, plugins = fake_tree / "src", fake_tree / "plugins"
    assert core_plugin_mentions(src, plugins) == []  # docstrings and comments do not count
    _write(src, {"core/y.py": code})
    (found,) = core_plugin_mentions(src, plugins)
    assert found.startswith("core/y.py:") and what in found


def test_a_partial_mention_is_not_a_name(fake_tree: Path) -> None:
    _write(fake_tree / "src", {"core/y.py": "MSG = 'install alpha first'\nX = f'{1} alpha'\nY = 'ember_a.x'\n"})
    assert core_plugin_mentions(fake_tree / "src", fake_tree / "plugins") == []


def test_a_planted_import_cycle_is_found(fake_tree: Path) -> None:
    src = fake_tree / "src"
    _write(src, {
        "core/a.py": "from .b import x\n",
        "core/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n"
                     "def f():\n    from .a import y\n",
        "core/sub/__init__.py": "from .c import z\n",
        "core/sub/c.py": "from .. import errors\n",
    })
    assert find_cycle(import_graph(src, "core")) is None  # deferred and type-only imports are not cycles
    assert len(function_level_imports(src, "core")) == 1
    _write(src, {"core/sub/c.py": "from .. import errors\nfrom ..a import x\n", "core/b.py": "import core.sub.c\n"})
    cycle = find_cycle(import_graph(src, "core"))
    assert cycle is not None and cycle[0] == cycle[-1]
    graph = import_graph(src, "core")
    assert all(b in graph[a] for a, b in zip(cycle, cycle[1:]))
    assert {"core.a", "core.b", "core.sub.c"} <= set(cycle)


def test_a_cycle_through_a_package_init_is_found(fake_tree: Path) -> None:
    src = fake_tree / "src"
    _write(src, {"core/sub/__init__.py": "from .c import z\n", "core/sub/c.py": "from ..x import q\n",
                 "core/x.py": "try:\n    from .sub.other import w\nexcept ImportError:\n    pass\n",
                 "core/sub/other.py": ""})
    assert find_cycle(import_graph(src, "core")) == ["core.sub", "core.sub.c", "core.x", "core.sub"]


def test_a_non_leaf_shapes_module_is_found(fake_tree: Path) -> None:
    src = fake_tree / "src"
    assert module_imports_from(src, "core.shapes", "core") == {"core.errors"}
    _write(src, {"core/shapes.py": "from . import errors\ndef f():\n    from .x import y\n"})
    assert module_imports_from(src, "core.shapes", "core") == {"core.errors", "core.x"}


if __name__ == "__main__":  # a report for humans: the module-level graph's cycles and the deferred imports
    g = import_graph(CORE_SRC)
    print("cycle:", find_cycle(g))
    deferred = function_level_imports(CORE_SRC)
    print(f"{len(deferred)} function-level imports of ember modules in core", file=sys.stderr)
