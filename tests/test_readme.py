"""The README tells the truth: its layout lists what exists (and every package), its commands name scripts, files,
benchmarks, nox sessions, distributions and extras that exist, its two fresh-machine commands are the ones CI runs,
its docs list matches the site's table of contents; and the repository stands on its own (cites no file it does
not contain)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def _commands(text: str) -> list[list[str]]:
    """Shell commands of the ```bash blocks: comments dropped, leading VAR=value assignments dropped."""
    out = []
    for block in _blocks(text, "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words.pop(0)
            if words:
                out.append(words)
    return out


def _layout_entries() -> list[str]:
    """Paths of the layout block: a top-level entry at column 0, a child at column 2 (joined to the last top-level
    directory); deeper-indented lines continue a description."""
    (block,) = _blocks(_section("Layout"), "")
    entries, parent = [], ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent > 2:
            continue
        name = line.split()[0]
        if indent == 0:
            entries.append(name)
            parent = name if name.endswith("/") else ""
        else:
            assert parent, f"layout line {line!r} is indented under a file"
            entries.append(parent + name)
    return entries


def _package_dirs() -> set[str]:
    dirs = [*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("plugins/*/*/pyproject.toml"),
            ROOT / "tests" / "example-backend" / "pyproject.toml"]
    return {p.parent.relative_to(ROOT).as_posix() + "/" for p in dirs if p.is_file()}


def _tracked_top_level_dirs() -> set[str]:
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return {f.split("/", 1)[0] + "/" for f in files.splitlines() if "/" in f}


def test_layout_lists_existing_paths() -> None:
    entries = _layout_entries()
    assert len(entries) > 10
    missing = [e for e in entries if not (ROOT / e).exists()]
    assert not missing, f"README layout lists paths that do not exist: {missing}"


def test_layout_lists_every_package_and_plugin() -> None:
    entries = set(_layout_entries())
    missing = sorted(_package_dirs() - entries)
    assert not missing, f"README layout omits package directories: {missing}"


def test_layout_lists_every_top_level_directory() -> None:
    missing = sorted(_tracked_top_level_dirs() - set(_layout_entries()))
    assert not missing, f"README layout omits top-level directories: {missing}"


def _nox_sessions() -> set[str] | None:
    """Every nox session, or None where nox is not installed (inside a nox session, say)."""
    if importlib.util.find_spec("nox") is None:
        return None
    # every session, selected by default ("* name -> doc") or on request ("- name -> doc"); --json lists only the first
    proc = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(re.findall(r"^[*-] (\S+) ->", proc.stdout, re.M))


def _distributions() -> dict[str, set[str]]:
    """Distribution name -> its extras, for every package of the repository."""
    out = {}
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("plugins/*/*/pyproject.toml")]:
        project = tomllib.loads(pyproject.read_text())["project"]
        out[project["name"]] = set(project.get("optional-dependencies", {}))
    return out


def _check_command(words: list[str], sessions: set[str] | None) -> str | None:
    """None when the command names things that exist, else what is wrong."""
    exe, args = words[0], words[1:]
    if exe.startswith(("./scripts/", "scripts/", ".ci/")):
        path = ROOT / exe
        return None if path.is_file() and os.access(path, os.X_OK) else f"{exe} is not an executable file"
    if exe in (".venv/bin/python", "python") and args and args[0].endswith(".py"):
        return None if (ROOT / args[0]).is_file() else f"{args[0]} does not exist"
    if exe.endswith("sphinx-build"):
        return None if (ROOT / args[-2] / "conf.py").is_file() else f"no Sphinx project at {args[-2]}"
    if exe.endswith("ember") and args[:1] == ["bench"]:
        from ember.cli import _BENCHMARKS

        name = next((a for a in args[1:] if not a.startswith("-")), None)
        return None if name is None or name in _BENCHMARKS else f"ember bench has no benchmark {name!r}"
    if exe.endswith("ember") and args[:1] != ["bench"]:  # a subcommand: core's or an installed package's
        from ember.cli import build_parser

        choices = next(a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        return None if args and args[0] in choices else f"ember has no subcommand {args[:1]}"
    if exe.endswith("nox"):
        if "-l" in args:
            return None
        if sessions is None:
            return None
        names = [a for a in args[args.index("-s") + 1:] if not a.startswith("-")]
        unknown = [n for n in names if n not in sessions]
        return f"no nox sessions {unknown}" if unknown or not names else None
    if exe == "pip" and args[:1] == ["install"]:
        dists = _distributions()
        for spec in args[1:]:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[([a-z0-9_,-]+)\])?", spec)
            if not match or match.group(1) not in dists:
                return f"pip install {spec}: no such distribution in the repository"
            extras = set(filter(None, (match.group(2) or "").split(",")))
            if extras - dists[match.group(1)]:
                return f"pip install {spec}: {match.group(1)} has no extra {sorted(extras - dists[match.group(1)])}"
        return None
    if exe == "hatch" and args == ["shell"]:
        members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["envs"]["default"]
        paths = [m if isinstance(m, str) else m["path"] for m in members["workspace"]["members"]]
        gone = [p for p in paths if not (ROOT / p / "pyproject.toml").is_file()]
        return f"hatch workspace members without a pyproject.toml: {gone}" if gone else None
    return f"the test does not know how to check {' '.join(words)!r}: teach it"


def test_readme_commands_name_things_that_exist() -> None:
    commands = _commands(README)
    sessions = _nox_sessions() if any(c[0].endswith("nox") and "-s" in c for c in commands) else None
    problems = [p for p in (_check_command(c, sessions) for c in commands) if p]
    assert len(commands) >= 10
    assert not problems, problems


def test_fresh_machine_commands_are_what_ci_and_the_scripts_run() -> None:
    quick = _commands(_section("Quick start (fresh machine)"))
    assert quick == [["./scripts/demo.sh"], ["./scripts/test.sh"]]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test\.sh\b", ci, re.M), ".ci/run must run scripts/test.sh"
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    test = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r"^scripts/setup\.sh demo$", demo, re.M)
    assert re.search(r"^scripts/setup\.sh test$", test, re.M)
    # test.sh proves the nox sessions install from a fresh clone (issue: nox sessions that never ran)
    assert re.search(r"nox -l$", test, re.M) and re.search(r"nox -s core_flex$", test, re.M)


def test_hatch_workspace_setup_and_nox_install_the_same_packages() -> None:
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["envs"]["default"]
    hatch = {(m if isinstance(m, str) else m["path"]).rstrip("/") + "/" for m in members["workspace"]["members"]}
    assert hatch == _package_dirs(), "hatch workspace members differ from the repository's packages"
    for script in ("scripts/setup.sh", "noxfile.py"):
        text = (ROOT / script).read_text()
        missing = sorted(d for d in _package_dirs() if f'"{d.rstrip("/")}' not in text)
        assert not missing, f"{script} does not install {missing}"


def _toctree_pages() -> set[str]:
    index = (ROOT / "docs" / "index.md").read_text()
    pages = set()
    for block in re.findall(r"^```\{toctree\}\n(.*?)^```", index, re.S | re.M):
        pages |= {f"docs/{line.strip()}.md" for line in block.splitlines() if line.strip() and ":" not in line}
    return pages


def test_readme_docs_list_is_the_sites_table_of_contents() -> None:
    listed = set(re.findall(r"`(docs/[\w/-]+\.md)`", _section("Docs")))
    pages = _toctree_pages()
    assert pages and all((ROOT / p).is_file() for p in pages)
    assert listed == pages, f"README lists {sorted(listed - pages)} extra, omits {sorted(pages - listed)}"


def test_every_docs_page_is_in_the_table_of_contents() -> None:
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts}
    assert pages - {"docs/index.md"} == _toctree_pages()


# Spelled in pieces so that this file does not match its own search.
_FOREIGN = ("DESIGN" + ".md", "../" + "shared")


def test_the_repository_cites_no_file_it_does_not_contain() -> None:
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    offenders = []
    for name in filter(None, files.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{name}: {needle}" for needle in _FOREIGN if needle in text]
    assert not offenders, offenders
