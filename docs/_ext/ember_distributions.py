"""Sphinx extension: the ``ember-distributions`` directive writes the Install page's tables from the packages'
pyproject.toml files, so the page cannot drift from what pip actually installs.

For every published distribution (``packages/*``, ``plugins/<kind>/*``) it lists the kind, the import name, the
description, the requirements, the extras with what each pulls in, and the entry points; for the default install
(``pip install ember``) and every extra it follows first-party requirements through to the full set of
distributions. Only the standard library (``tomllib``) and ``packaging`` (a Sphinx dependency) are used.

The generated text is MyST Markdown (the site's source format), parsed in place of the directive; use the directive
from a Markdown page.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

# plugins/<folder>/<name>: the folder is the plugin's kind
_PLUGIN_KINDS = {"backends": "backend plugin", "decorators": "decorator plugin", "extensions": "extension plugin"}
_PACKAGE_KINDS = {"ember-core": "core", "ember": "meta distribution", "ember-train": "training"}


@dataclass
class Distribution:
    name: str
    path: str  # relative to the repository root
    kind: str
    description: str
    imports: list[str]
    requires: list[Requirement]
    extras: dict[str, list[Requirement]]
    entry_points: dict[str, dict[str, str]] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)


def _imports(data: dict[str, Any]) -> list[str]:
    wheel = data.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {})
    return [Path(p).name for p in wheel.get("packages", [])]


def collect(root: Path = ROOT) -> list[Distribution]:
    """Every published distribution of the repository, core first, then the other packages, then the plugins."""
    found: list[tuple[Path, str]] = []
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        found.append((pyproject, _PACKAGE_KINDS.get(pyproject.parent.name, "package")))
    for pyproject in sorted((root / "plugins").glob("*/*/pyproject.toml")):
        found.append((pyproject, _PLUGIN_KINDS.get(pyproject.parent.parent.name, "plugin")))
    order = {"core": 0, "meta distribution": 1, "training": 2}
    found.sort(key=lambda item: (order.get(item[1], 3), item[1], item[0].parent.name))
    dists = []
    for pyproject, kind in found:
        data = tomllib.loads(pyproject.read_text())
        project = data["project"]
        dists.append(Distribution(
            name=project["name"],
            path=pyproject.parent.relative_to(root).as_posix(),
            kind=kind,
            description=project.get("description", ""),
            imports=_imports(data),
            requires=[Requirement(r) for r in project.get("dependencies", [])],
            extras={k: [Requirement(r) for r in v] for k, v in project.get("optional-dependencies", {}).items()},
            entry_points=project.get("entry-points", {}),
            scripts=project.get("scripts", {}),
        ))
    return dists


def pulls_in(requirements: list[Requirement], dists: list[Distribution]) -> tuple[list[str], list[str]]:
    """What installing ``requirements`` brings: (first-party distributions, third-party requirements), following
    first-party requirements (and the extras they name) transitively. Third-party packages' own dependencies are
    not followed: those are the third parties' business."""
    by_name = {d.name: d for d in dists}
    first: list[str] = []
    third: dict[str, Requirement] = {}
    pending = list(requirements)
    while pending:
        req = pending.pop(0)
        dist = by_name.get(req.name)
        if dist is None:
            third.setdefault(req.name, req)
            continue
        if dist.name not in first:
            first.append(dist.name)
            pending.extend(dist.requires)
        for extra in sorted(req.extras):
            pending.extend(dist.extras.get(extra, []))
    return first, sorted(str(r) for r in third.values())


def _code(items: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in items) if items else "nothing else"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return [*lines, ""]


def render_markdown(dists: list[Distribution]) -> str:
    """The Install page's generated part, as MyST Markdown."""
    lines: list[str] = []
    rows = []
    for d in dists:
        imports = _code(d.imports) if d.imports else "none (metadata only)"
        rows.append((f"`{d.name}`", d.kind, imports, d.description.replace("`", "")))
    lines += _table(("Distribution", "Kind", "Import", "What it is"), rows)

    meta = next((d for d in dists if d.kind == "meta distribution"), None)
    if meta is not None:
        first, third = pulls_in([Requirement(meta.name)], dists)
        lines += [f"`pip install {meta.name}` installs {_code(first)}, and from PyPI {_code(third)} (with "
                  "their own dependencies).", ""]

    for d in dists:
        lines += [f"```{{rubric}} {d.name}", "```", "", f"`{d.path}`: {d.kind}.", ""]
        lines += [f"Requires: {_code([str(r) for r in d.requires])}.", ""]
        if d.extras:
            base = set(sum(pulls_in([Requirement(d.name)], dists), []))
            rows = []
            for extra, reqs in d.extras.items():
                # what the extra adds to an install of the distribution itself
                added = [x for x in sum(pulls_in([Requirement(f"{d.name}[{extra}]")], dists), []) if x not in base]
                rows.append((f"`{d.name}[{extra}]`", _code([str(r) for r in reqs]),
                             _code(added) if added else "nothing new (already installed with it)"))
            lines += _table(("Extra", "Requires", "Adds to the install"), rows)
        points = [f"`{name} = {target}` (console script)" for name, target in d.scripts.items()]
        for group, entries in d.entry_points.items():
            points += [f"`{name} = {target}` (group `{group}`)" for name, target in entries.items()]
        if points:
            lines += ["Entry points: " + "; ".join(points) + ".", ""]
    return "\n".join(lines)


def setup(app: Any) -> dict[str, Any]:
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class DistributionsDirective(SphinxDirective):
        has_content = False

        def run(self) -> list[Any]:
            for d in collect():
                self.env.note_dependency(str(ROOT / d.path / "pyproject.toml"))
            from docutils import nodes

            container = nodes.container()
            text = render_markdown(collect())
            self.state.nested_parse(StringList(text.splitlines(), source="pyproject.toml"), self.content_offset,
                                    container)
            return container.children

    app.add_directive("ember-distributions", DistributionsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
