"""The monorepo's packaging rules: lock-step versions, pinned core ranges, one extra per plugin, entry points."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ember.plugins.hookspecs import CONTRACT_VERSION

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "packages" / "ember-core"
META = ROOT / "packages" / "ember"
PLUGINS = sorted(p.parent for p in (ROOT / "plugins").glob("*/*/pyproject.toml"))
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))
ALL = [*PACKAGES, *PLUGINS]


def _project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())


def _reqs(items: list[str]) -> dict[str, Requirement]:
    return {r.name: r for r in map(Requirement, items)}


VERSION = _project(CORE)["project"]["version"]


def test_there_are_plugins_and_packages() -> None:
    assert PLUGINS, "no plugin pyproject.toml found under plugins/<kind>/<name>/"
    assert {CORE, META} <= set(PACKAGES)


@pytest.mark.parametrize("path", [p for p in PACKAGES if p not in (CORE, META)], ids=lambda p: p.name)
def test_other_packages_pin_core_and_are_the_default_install_or_a_library_of_plugins(path: Path) -> None:
    """ember-train is in the default install; a library package (the kernel generators, the CuPy backend) is no
    plugin and has no extra: the plugins that use it require it, with the same lock-step range."""
    data = _project(path)
    name = data["project"]["name"]
    core = _reqs(data["project"]["dependencies"])["ember-core"]
    assert core.specifier.contains(VERSION)
    assert "ember" not in data["project"].get("entry-points", {}), f"{name} is under packages/ but is a plugin"
    meta = _reqs(_project(META)["project"]["dependencies"])
    users = [p.name for p in ALL if name in _reqs(_project(p)["project"].get("dependencies", []))]
    assert name in meta or users, f"{name} is neither in the default install nor required by a plugin"
    for user in users:
        assert _reqs(_project(ROOT / next(str(p.relative_to(ROOT)) for p in ALL if p.name == user))
                     ["project"]["dependencies"])[name].specifier.contains(VERSION)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_lock_step_version_and_hatchling(path: Path) -> None:
    data = tomllib.loads((path / "pyproject.toml").read_text())
    assert data["project"]["version"] == VERSION
    assert data["build-system"]["build-backend"] == "hatchling.build"
    assert (path / "README.md").is_file()


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: p.name)
def test_plugin_pins_core_declares_contract_and_entry_point(path: Path) -> None:
    data = _project(path)
    core = _reqs(data["project"]["dependencies"])["ember-core"]
    assert core.specifier.contains(VERSION), f"{path.name} does not accept ember-core {VERSION}"
    assert str(core.specifier) != "", f"{path.name} must pin a compatible ember-core range"
    assert data["tool"]["ember"]["contract"] == CONTRACT_VERSION
    assert data["project"]["entry-points"]["ember"], "a plugin registers in the `ember` entry-point group"
    assert (path / "tests").is_dir(), f"{path.name} has no tests/"
    assert (ROOT / "docs" / "plugins" / f"{path.name.removeprefix('ember-')}.md").is_file(), "no guide page"


def test_meta_package_has_one_extra_per_plugin_and_all() -> None:
    meta = _project(META)["project"]
    deps = _reqs(meta["dependencies"])
    assert str(deps["ember-core"].specifier) == f"=={VERSION}"
    extras = meta["optional-dependencies"]
    core_extras = _project(CORE)["project"]["optional-dependencies"]
    everything = set(_reqs(extras["all"]))
    for path in PLUGINS:
        dist = _project(path)["project"]["name"]
        extra = dist.removeprefix("ember-")
        assert _reqs(extras[extra])[dist].specifier.contains(VERSION)
        assert dist in _reqs(core_extras.get(extra, [])), f"ember-core lacks the [{extra}] extra"
        assert dist in everything, f"ember[all] lacks {dist}"


def _distributions_ext():
    """docs/_ext/ember_distributions.py, the generator of the docs' Install page."""
    import importlib.util
    import sys

    path = ROOT / "docs" / "_ext" / "ember_distributions.py"
    spec = importlib.util.spec_from_file_location("ember_distributions", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def test_install_page_lists_every_distribution_and_extra() -> None:
    ext = _distributions_ext()
    assert "```{ember-distributions}" in (ROOT / "docs" / "install.md").read_text()
    text = ext.render_markdown(ext.collect(ROOT))
    for path in ALL:
        project = _project(path)["project"]
        assert f"`{project['name']}`" in text
        for extra in project.get("optional-dependencies", {}):
            assert f"`{project['name']}[{extra}]`" in text, f"the Install page omits {project['name']}[{extra}]"


def test_what_pip_install_ember_pulls_in() -> None:
    ext = _distributions_ext()
    dists = ext.collect(ROOT)
    first, third = ext.pulls_in([Requirement("ember")], dists)
    # the default install: core, the CPU backend, gradients and training (and ember-train's own dependencies)
    assert set(first) == {"ember", "ember-core", "ember-flex", "ember-autodiff", "ember-train"}
    assert {"scikit-learn", "scipy", "pillow", "rich", "numpy"} <= {Requirement(r).name for r in third}
    # an extra follows through to the plugin's own requirements
    first, third = ext.pulls_in([Requirement("ember-core[opencl]")], dists)
    assert "ember-opencl" in first and "pyopencl" in {Requirement(r).name for r in third}
