"""Namespaces plugins publish on ``ember`` (``register_namespaces``): lookup, the open ``ember.linalg``, conflicts,
refused names and the missing-plugin error."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

import ember
from ember.errors import MissingPluginError, PluginError
from ember.plugins import hookimpl, manager
from ember.plugins.namespaces import install_extra_hint


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


@pytest.fixture
def plugins() -> Iterator[Any]:
    """Registers plugin objects for one test and removes them (and their namespaces) afterwards."""
    reg = manager.registry.ensure_loaded()
    added: list[tuple[object, str]] = []
    saved = dict(reg.namespaces)

    def add(plugin: object, name: str) -> None:
        reg.register_plugin(plugin, name)
        added.append((plugin, name))

    yield add
    for plugin, name in added:
        if reg._manager().is_registered(plugin):
            reg._manager().unregister(plugin)
        reg.plugins[:] = [p for p in reg.plugins if p.name != name]
    reg.namespaces.clear()
    reg.namespaces.update(saved)
    reg.conflicts[:] = [c for c in reg.conflicts if c.what != "namespace"]


def _plugin(*pairs: tuple[str, str]) -> object:
    class Plugin:
        @hookimpl
        def register_namespaces(self, register: Any) -> None:
            for name, module in pairs:
                register(name, module)

    return Plugin()


def test_a_registered_module_is_ember_attribute_and_imported_on_first_use(plugins: Any,
                                                                           monkeypatch: Any) -> None:
    probe = _module("ember_ns_probe", all_reduce=lambda x: x + 1)
    monkeypatch.setitem(sys.modules, "ember_ns_probe", probe)
    plugins(_plugin(("nsprobe", "ember_ns_probe"), ("nsprobe_fn", "ember_ns_probe:all_reduce")), "ns-test")
    assert ember.nsprobe is probe
    assert ember.nsprobe.all_reduce(1) == 2
    assert ember.nsprobe_fn(2) == 3
    assert hasattr(ember, "nsprobe")


def test_linalg_keeps_core_names_and_asks_the_plugin_for_the_rest(plugins: Any, monkeypatch: Any) -> None:
    def probe_solve(a: Any) -> str:
        return "from the plugin"

    monkeypatch.setitem(sys.modules, "ember_ns_linalg", _module("ember_ns_linalg", probe_solve=probe_solve,
                                                                matmul="shadowed"))
    manager.registry.namespaces.pop("linalg", None)  # an installed ember-linalg gives way for this test
    plugins(_plugin(("linalg", "ember_ns_linalg")), "ns-linalg")
    from ember.ops.linalg import matmul

    assert ember.linalg.matmul is matmul  # core's names win
    assert ember.linalg.probe_solve(None) == "from the plugin"
    assert "probe_solve" in dir(ember.linalg) and "vector_norm" in dir(ember.linalg)
    with pytest.raises(AttributeError, match="neither core nor the plugin 'ns-linalg'.*no_such_fn|no_such_fn"):
        ember.linalg.no_such_fn  # noqa: B018


def test_without_a_plugin_linalg_names_the_extra_when_the_distribution_has_one(monkeypatch: Any) -> None:
    from ember.plugins import namespaces

    monkeypatch.setattr(namespaces, "install_extra_hint",
                        lambda ns: f"it comes from the ember-{ns} plugin: pip install 'ember[{ns}]'")
    monkeypatch.setattr(namespaces, "_target", lambda ns: None)
    with pytest.raises(MissingPluginError, match=r"ember\.linalg\.probe_solve is not part of ember-core; .*"
                                                 r"pip install 'ember\[linalg\]'"):
        ember.linalg.probe_solve  # noqa: B018
    assert not hasattr(ember.linalg, "probe_solve")  # an AttributeError: hasattr and getattr defaults work
    with pytest.raises(MissingPluginError, match=r"ember\.distributed is provided by a plugin that is not "
                                                 r"installed; .*pip install 'ember\[distributed\]'"):
        ember.distributed  # noqa: B018


def test_unknown_names_stay_plain_attribute_errors(monkeypatch: Any) -> None:
    from ember.plugins import namespaces

    monkeypatch.setattr(namespaces, "install_extra_hint", lambda ns: None)
    with pytest.raises(AttributeError, match="module 'ember' has no attribute 'no_such_thing'") as info:
        ember.no_such_thing  # noqa: B018
    assert not isinstance(info.value, MissingPluginError)
    with pytest.raises(AttributeError):
        ember.__wrapped__  # noqa: B018  (dunders never load plugins)


def test_the_hint_reads_the_installed_extras() -> None:
    # ember-core declares no extra called "no-such-extra", so no line is made up for it
    assert install_extra_hint("no_such_namespace_xyz") is None


@pytest.mark.parametrize(("name", "module", "match"), [
    ("save", "ember_ns_probe", "one of core's own names"),
    ("nn", "ember_ns_probe", "one of core's own names"),
    ("tensor", "ember_ns_probe", "one of core's own names"),
    ("_private", "ember_ns_probe", "public identifier"),
    ("class", "ember_ns_probe", "public identifier"),
    ("good", "not a path", "import path"),
    ("good", "pkg.mod:not-ok", "import path"),
])
def test_refused_registrations_fail_the_plugin_and_leave_nothing(plugins: Any, name: str, module: str,
                                                                 match: str) -> None:
    reg = manager.registry
    with pytest.raises(PluginError, match=match):  # strict mode (the tests' setting) makes the failure fatal
        plugins(_plugin((name, module)), "ns-bad")
    assert name not in reg.namespaces or reg.namespaces[name].plugin != "ns-bad"
    reg._fatal = None


def test_two_plugins_publishing_one_name_is_a_conflict(plugins: Any, monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.setitem(sys.modules, "ember_ns_a", _module("ember_ns_a"))
    monkeypatch.setitem(sys.modules, "ember_ns_b", _module("ember_ns_b"))
    monkeypatch.delenv("EMBER_STRICT_PLUGINS", raising=False)
    plugins(_plugin(("nsshared", "ember_ns_a")), "ns-first")
    plugins(_plugin(("nsshared", "ember_ns_b")), "ns-second")
    assert "namespace 'nsshared' is registered by plugins 'ns-first' and 'ns-second'" in caplog.text
    assert ember.nsshared is sys.modules["ember_ns_a"]


def test_a_namespace_whose_module_cannot_be_imported_names_the_plugin(plugins: Any) -> None:
    plugins(_plugin(("nsbroken", "ember_ns_does_not_exist")), "ns-broken")
    with pytest.raises(PluginError, match="plugin 'ns-broken' publishes ember.nsbroken as "
                                          "'ember_ns_does_not_exist', which cannot be imported"):
        ember.nsbroken  # noqa: B018


def test_lookups_from_several_threads_agree(plugins: Any, monkeypatch: Any) -> None:
    probe = _module("ember_ns_threads", value=7)
    monkeypatch.setitem(sys.modules, "ember_ns_threads", probe)
    plugins(_plugin(("nsthreads", "ember_ns_threads")), "ns-threads")
    seen: list[Any] = []
    workers = [threading.Thread(target=lambda: seen.extend(ember.nsthreads.value for _ in range(200)))
               for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert seen == [7] * 800
