"""Plugin discovery across installed distributions: entry points, tolerance, strictness, contract checks,
missing-plugin messages, the default device, lazy import, and the hookspec/doc agreement."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import ember
from ember import Device, PluginError
from ember import device as device_mod
from ember.plugins import CONTRACT_VERSION, hookimpl, manager

ROOT = Path(__file__).resolve().parents[1]


def _backend_plugin(name: str, *, contract: int = CONTRACT_VERSION, kind: str = "emulated", priority: int = 0,
                    count: int | None = None, **extra: Any) -> Any:
    """A programmatic plugin registering one backend built on flex (its factory is never the point here)."""

    class Plugin:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            def factory(index: int = 0, **options: Any) -> Any:
                from ember_flex.backend import FlexBackend

                return FlexBackend(index)

            register(name, factory, contract=contract, kind=kind, priority=priority,
                     is_available=None if count is None else (lambda: count), description=f"test backend {name}",
                     **extra)

    return Plugin()


class _RaisingPlugin:
    @hookimpl
    def register_backends(self, register: Any) -> None:
        raise RuntimeError("driver exploded")


# -- discovery ------------------------------------------------------------------------------------------------
def test_discovery_finds_flex_through_its_entry_point(plugins: manager.PluginRegistry) -> None:
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="ember")}
    assert eps.get("flex") == "ember_flex.plugin"
    assert plugins.backends == {}  # nothing is discovered until asked
    spec = plugins.backend("flex")
    assert spec.kind == "cpu" and spec.contract == CONTRACT_VERSION and spec.plugin == "flex"
    assert spec.device_count() == 1
    record = next(p for p in plugins.plugins if p.name == "flex")
    assert (record.distribution, record.module, record.error) == ("ember-flex", "ember_flex.plugin", "")
    assert record.version == metadata.version("ember-flex")
    assert Device.flex().stack.name.split("+")[0] == "flex"  # fused ("flex+fusion") when ember-fusion is installed


def test_example_backend_is_discovered_and_loses_to_real_hardware(plugins: manager.PluginRegistry) -> None:
    pytest.importorskip("ember_example_backend")
    spec = plugins.backend("toy")
    assert (spec.kind, spec.contract, spec.plugin) == ("emulated", CONTRACT_VERSION, "toy")
    # the toy backend is "emulated": flex ("cpu") is the better default
    assert Device.default() is Device("flex")
    x = ember.tensor([1.0, 2.0], device=Device.parse("toy"))
    assert type(x._h).__name__ == "ToyArray"
    assert (x + x).tolist() == [2.0, 4.0]


def test_discovery_is_lazy_and_happens_once(plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = manager.metadata.entry_points

    def counting(**kw: Any) -> Any:
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(manager.metadata, "entry_points", counting)
    Device.flex()
    assert Device.flex().stack is not None
    Device.default()
    assert calls == [{"group": "ember"}]


def test_disabled_plugin_is_skipped_and_device_names_the_extra(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_DISABLE_PLUGINS", " flex ,something-else")
    with pytest.raises(PluginError) as err:
        Device.flex()
    msg = str(err.value)
    # flex is installed: the hint says it is disabled rather than to install it again
    assert "the plugin 'flex' (ember-flex) is installed but disabled by EMBER_DISABLE_PLUGINS" in msg
    assert "pip install" not in msg
    assert all(p.name != "flex" for p in plugins.plugins)
    assert "flex" not in plugins.backends


# -- broken plugins -------------------------------------------------------------------------------------------
def test_plugin_whose_hook_raises_is_logged_and_skipped(
    plugins: manager.PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    broken = _RaisingPlugin()
    with caplog.at_level(logging.WARNING, logger="ember.plugins"):
        plugins.register_plugin(broken, name="exploding")
    record = next(p for p in plugins.plugins if p.name == "exploding")
    assert "RuntimeError" in record.error and "driver exploded" in record.error
    assert any("exploding" in r.getMessage() and "driver exploded" in r.getMessage() for r in caplog.records)
    assert not plugins._manager().is_registered(broken)  # its hooks must not run again (plugin_info, ...)
    # the rest still works
    plugins.register_plugin(_backend_plugin("fine"), name="fine")
    assert plugins.backend("fine").plugin == "fine"


def test_plugin_whose_hook_raises_is_fatal_when_strict(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"'exploding'.*driver exploded"):
        plugins.register_plugin(_RaisingPlugin(), name="exploding")


def _with_fake_entry_point(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    real = manager.metadata.entry_points

    def entry_points(**kw: Any) -> list[Any]:
        return [*real(**kw), metadata.EntryPoint(name=name, value=value, group=manager.ENTRY_POINT_GROUP)]

    monkeypatch.setattr(manager.metadata, "entry_points", entry_points)


def test_entry_point_that_fails_to_import_is_skipped(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _with_fake_entry_point(monkeypatch, "ghost", "ember_ghost_plugin_that_does_not_exist.plugin")
    with caplog.at_level(logging.WARNING, logger="ember.plugins"):
        assert Device.flex() is Device("flex")  # the good plugin still loads
    record = next(p for p in plugins.plugins if p.name == "ghost")
    assert record.error.startswith("import failed: ModuleNotFoundError")
    assert any("ghost" in r.getMessage() for r in caplog.records)
    with pytest.raises(PluginError) as err:
        Device.parse("ghost")
    assert "failed to load" in str(err.value) and "ModuleNotFoundError" in str(err.value)
    assert "reinstall or upgrade it" in str(err.value) and "pip install" not in str(err.value)


def test_entry_point_that_fails_to_import_is_fatal_when_strict(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_STRICT_PLUGINS", "1")
    _with_fake_entry_point(monkeypatch, "ghost", "ember_ghost_plugin_that_does_not_exist.plugin")
    with pytest.raises(PluginError, match=r"'ghost'.*ember_ghost_plugin_that_does_not_exist.*import failed"):
        Device.flex()


def test_contract_mismatch_is_skipped_with_a_clear_message(
    plugins: manager.PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    future = CONTRACT_VERSION + 1
    with caplog.at_level(logging.WARNING, logger="ember.plugins"):
        plugins.register_plugin(_backend_plugin("future", contract=future), name="futureplugin")
    assert "future" not in plugins.backends
    record = next(p for p in plugins.plugins if p.name == "futureplugin")
    for part in (f"contract {future}", f"implements contract {CONTRACT_VERSION}", "'future'", "upgrade"):
        assert part in record.error
    assert any("futureplugin" in r.getMessage() and f"contract {future}" in r.getMessage() for r in caplog.records)
    with pytest.raises(PluginError, match="no backend named 'future'"):
        Device("future")._checked()


def test_decorator_contract_mismatch_is_skipped(plugins: manager.PluginRegistry) -> None:
    class Plugin:
        @hookimpl
        def register_decorators(self, register: Any) -> None:
            register("olddeco", lambda inner, **kw: inner, contract=0)

    plugins.register_plugin(Plugin(), name="olddeco-plugin")
    assert plugins.decorator("olddeco") is None
    assert "contract 0" in next(p for p in plugins.plugins if p.name == "olddeco-plugin").error


# -- missing plugins: hints name only extras that exist -----------------------------------------------------------
@pytest.mark.parametrize("make, name", [
    (lambda: Device.cuda(0), "cuda"),
    (lambda: Device.rocm(), "rocm"),
    (lambda: Device.wgpu(0), "wgpu"),
    (lambda: Device.parse("cuda:1"), "cuda"),
])
def test_missing_backend_without_a_plugin_names_no_extra(plugins: manager.PluginRegistry, make: Any,
                                                         name: str) -> None:
    plugins.ensure_loaded()
    if name in plugins.backends:
        pytest.skip(f"the {name} plugin is installed here")
    with pytest.raises(PluginError) as err:
        make()
    msg = str(err.value)
    assert f"no backend named {name!r} is installed" in msg
    assert "no plugin provides this device; see docs/plugins" in msg and "pip install" not in msg
    assert "flex" in msg  # lists what *is* installed


def test_unknown_decorator_names_the_extra(plugins: manager.PluginRegistry) -> None:
    plugins.ensure_loaded()
    if "autodiff" in plugins.decorators:
        pytest.skip("the autodiff plugin is installed here")
    with pytest.raises(AttributeError) as err:
        Device.flex().autodiff()
    assert "pip install 'ember[autodiff]'" in str(err.value) and "'autodiff'" in str(err.value)
    with pytest.raises(ember.DeviceError, match=r"'flex\+autodiff'.*'autodiff' is not an installed decorator"):
        Device.parse("flex+autodiff")


def test_the_gradient_decorator_is_found_by_its_declared_capability(plugins: manager.PluginRegistry) -> None:
    plugins.ensure_loaded()
    spec = plugins.differentiable_decorator()
    assert spec is not None and spec.differentiable
    assert Device.parse(f"flex+{spec.name}").stack.differentiable  # the flag tells the truth
    assert all(not d.differentiable for d in plugins.decorators.values() if d is not spec)
    x = ember.ones(2, device=Device.flex().fusion(False), requires_grad=True)
    fix = rf"ember\.device\('flex\+fusion\(enabled=False\)'\)\.{spec.name}\(\)"
    with pytest.raises(ember.AutodiffError, match=rf"record no gradients; .*{fix}"):
        (x * 2).sum().backward()
    # without one installed, the error says so and names the plugin extras instead of a decorator
    plugins.decorators = {n: d for n, d in plugins.decorators.items() if not d.differentiable}
    assert plugins.differentiable_decorator() is None
    with pytest.raises(ember.AutodiffError, match="no installed decorator records gradients: install a decorator"):
        (x * 2).sum().backward()


def test_private_attributes_do_not_trigger_discovery(plugins: manager.PluginRegistry) -> None:
    with pytest.raises(AttributeError):
        Device("flex")._no_such_thing  # noqa: B018
    assert not plugins._loaded


def test_registered_decorator_wraps_the_backend(plugins: manager.PluginRegistry) -> None:
    class Wrapper:
        def __init__(self, inner: Any, **options: Any) -> None:
            self.inner, self.options = inner, options

    class Plugin:
        @hookimpl
        def register_decorators(self, register: Any) -> None:
            register("wrapped", Wrapper, contract=CONTRACT_VERSION)

    plugins.register_plugin(Plugin(), name="wrapper-plugin")
    dev = Device.flex().wrapped(level=2)
    assert str(dev) == "flex+wrapped(level=2)" and dev.base is Device.flex()
    assert Device.parse(str(dev)) is dev  # option values parse back as Python literals (2, not "2")
    assert Device.parse("flex+wrapped(level=two)").decorators == (("wrapped", (("level", "two"),)),)
    assert isinstance(dev.stack, Wrapper) and dev.stack.options == {"level": 2}
    assert dev.stack.inner is Device.flex().stack  # one backend shared by every decoration


def test_automatic_decorator_applies_where_the_backend_accepts_it(plugins: manager.PluginRegistry) -> None:
    """An automatic decorator with ``applies_to`` wraps only the backends it accepts on devices that do not name
    it; a device that names it gets it anyway, and ``name(False)`` still opts out."""

    class Wrapper:
        def __init__(self, inner: Any, **options: Any) -> None:
            self.inner, self.options = inner, options

    seen: list[Any] = []

    def accepts(backend: Any) -> bool:
        seen.append(backend)
        return type(backend).__name__ != "FlexBackend"

    class Plugin:
        @hookimpl
        def register_decorators(self, register: Any) -> None:
            register("autowrap", Wrapper, contract=CONTRACT_VERSION, automatic=True, applies_to=accepts)

    plugins.register_plugin(Plugin(), name="autowrap-plugin")
    flex_stack = Device.flex().stack
    assert type(flex_stack).__name__ == "FlexBackend" and seen  # declined: the predicate was asked
    named = Device.flex().autowrap()
    assert str(named) == "flex+autowrap" and named is not Device.flex()
    assert isinstance(named.stack, Wrapper) and named.stack.inner is flex_stack
    assert Device.parse("flex+autowrap") is named
    assert not isinstance(Device.flex().autowrap(False).stack, Wrapper)

    class Other(type(flex_stack)):  # type: ignore[misc]
        pass

    Other.__name__ = "OtherBackend"
    assert plugins.decorator("autowrap").applies_unnamed(Other()) is True

    def broken(backend: Any) -> bool:
        raise RuntimeError("predicate exploded")

    spec = manager.DecoratorSpec("x", Wrapper, CONTRACT_VERSION, automatic=True, applies_to=broken)
    assert spec.applies_unnamed(flex_stack) is True  # a broken predicate keeps the documented default: apply


# -- the default device -----------------------------------------------------------------------------------------
def test_default_device_honours_ember_device(plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    plugins.register_plugin(_backend_plugin("fakeemu"), name="fakeemu")
    assert Device.default() is Device("flex")
    monkeypatch.setenv("EMBER_DEVICE", "fakeemu")
    assert Device.default() is Device("fakeemu", 0)
    monkeypatch.setenv("EMBER_DEVICE", "flex")
    assert Device.default() is Device("flex")
    monkeypatch.setenv("EMBER_DEVICE", "nosuchbackend:0")
    with pytest.raises(PluginError, match=r"'nosuchbackend'.*no plugin provides this device"):
        Device.default()


def test_default_device_prefers_present_gpus(plugins: manager.PluginRegistry) -> None:
    plugins.register_plugin(_backend_plugin("absentgpu", kind="gpu", count=0), name="absentgpu")
    assert Device.default() is Device("flex")  # a GPU plugin without hardware is not a candidate
    plugins.register_plugin(_backend_plugin("slowgpu", kind="gpu", count=1, priority=1), name="slowgpu")
    plugins.register_plugin(_backend_plugin("fastgpu", kind="gpu", count=2, priority=5), name="fastgpu")
    assert Device.default() is Device("fastgpu", 0)


def test_default_device_ranks_devices_by_their_own_kind(plugins: manager.PluginRegistry) -> None:
    # an OpenCL-style plugin: registered as a GPU backend, but its device 0 is a CPU runtime (PoCL)
    plugins.register_plugin(_backend_plugin("cpuruntime", kind="gpu", count=1, priority=-1,
                                            device_kind=lambda i: "cpu"), name="cpuruntime")
    assert Device.default() is Device("flex")  # not preferred over flex: same rank, lower priority
    plugins.register_plugin(_backend_plugin("realgpu", kind="gpu", count=1, priority=-1,
                                            device_kind=lambda i: "gpu"), name="realgpu")
    assert Device.default() is Device("realgpu", 0)


def test_a_failing_device_kind_ranks_lowest(plugins: manager.PluginRegistry) -> None:
    def broken(index: int) -> str:
        raise RuntimeError("driver cannot describe device")

    plugins.register_plugin(_backend_plugin("flaky", kind="gpu", count=1, priority=9, device_kind=broken),
                            name="flaky")
    assert plugins.backend("flaky").kind_of(0) == "emulated"
    assert Device.default() is Device("flex")


def test_absent_devices_show_the_plugins_install_hint(plugins: manager.PluginRegistry) -> None:
    plugins.register_plugin(_backend_plugin("hinted", kind="gpu", count=0, install_hint="install the Foo driver"),
                            name="hinted")
    with pytest.raises(ember.DeviceError, match=r"only 0 hinted device\(s\) found \(install the Foo driver\)"):
        Device("hinted", 0)._checked()
    plugins.register_plugin(_backend_plugin("plain", kind="gpu", count=0), name="plain")
    with pytest.raises(ember.DeviceError, match="is the plain driver/runtime installed"):
        Device("plain", 0)._checked()


def test_memory_dry_run_is_a_no_op_context_without_a_pool() -> None:
    for dev in (Device.flex(), Device.flex().autodiff()):
        with dev.memory_dry_run() as stats:
            (ember.ones(3, device=dev) + 1).sum()
        assert stats == {}


def test_default_device_without_any_backend_names_flex(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager.metadata, "entry_points", lambda **kw: [])
    with pytest.raises(PluginError, match=r"pip install 'ember\[flex\]'"):
        Device.default()


# -- plugin_info and ember.info() ---------------------------------------------------------------------------------
def test_hook_results_collects_plugin_info_and_survives_a_broken_hook(plugins: manager.PluginRegistry) -> None:
    class Bad:
        @hookimpl
        def plugin_info(self) -> dict[str, Any]:
            raise ValueError("no driver")

    plugins.register_plugin(Bad(), name="bad-info")
    results = plugins.hook_results("plugin_info")
    assert results["flex"]["numpy"] == __import__("numpy").__version__
    assert results["bad-info"] == {"error": "ValueError: no driver"}


def test_info_reports_plugins_backends_and_errors(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_fake_entry_point(monkeypatch, "ghost", "ember_ghost_plugin_that_does_not_exist.plugin")
    info = ember.info()
    json.dumps(info)  # plain data only
    assert info["ember"] == ember.__version__ and info["contract"] == CONTRACT_VERSION
    flex = next(b for b in info["backends"] if b["name"] == "flex")
    assert flex == {**flex, "kind": "cpu", "devices": 1, "contract": CONTRACT_VERSION, "plugin": "flex"}
    names = {p["name"]: p for p in info["plugins"]}
    assert names["flex"]["error"] is None and names["flex"]["distribution"] == "ember-flex"
    assert "import failed" in names["ghost"]["error"]
    assert any("ghost" in e for e in info["errors"])
    assert info["default_device"] == "flex"
    assert "numpy" in info["plugin_info"]["flex"]


def test_info_reports_strict_failures_instead_of_raising(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_STRICT_PLUGINS", "1")
    _with_fake_entry_point(monkeypatch, "ghost", "ember_ghost_plugin_that_does_not_exist.plugin")
    info = ember.info()
    assert any("ghost" in e and "import failed" in e for e in info["errors"])


# -- import cost and the documented contract --------------------------------------------------------------------
def test_import_ember_loads_no_backend_and_no_plugin_machinery() -> None:
    code = (
        "import sys, json; import ember; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ember_flex', 'ember_example_backend', 'pluggy', 'torch') or m == 'ember.plugins')))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout) == []


def _documented_signatures() -> list[tuple[str, str]]:
    from ember.plugins import hookspecs

    found = []
    for name in dir(hookspecs):
        fn = getattr(hookspecs, name)
        if callable(fn) and hasattr(fn, "ember_spec"):
            for sig in re.findall(r"``(register\(.*?\))``", fn.__doc__ or ""):
                found.append((name, sig))
    return found


def test_every_hookspec_signature_appears_verbatim_in_the_plugin_author_docs() -> None:
    from ember.plugins import hookspecs

    doc = (ROOT / "docs" / "plugin-authors.md").read_text(encoding="utf-8")
    sigs = _documented_signatures()
    assert {name for name, _ in sigs} == {"register_backends", "register_decorators", "register_ops",
                                        "register_backend_traits", "register_namespaces"}
    for name, sig in sigs:
        assert f"`{name}(register)`" in doc, f"docs/plugin-authors.md does not document the hook {name}"
        assert f"`{sig}`" in doc, f"docs/plugin-authors.md lacks the {name} signature {sig!r}"
    hooks = [n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "ember_spec")]
    for name in hooks:
        assert f"`{name}(" in doc, f"docs/plugin-authors.md does not mention the hook {name}"


def test_example_backend_implements_only_the_required_primitives() -> None:
    """tests/example-backend proves the default compositions: it must not override any of them."""
    import inspect

    from ember.backend import Backend

    toy = pytest.importorskip("ember_example_backend.backend")
    required = {
        name for name, fn in vars(Backend).items()
        if inspect.isfunction(fn) and "raise self._missing(" in inspect.getsource(fn)
    }
    assert {"from_numpy", "getitem", "matmul", "randn"} <= required and "softmax" not in required
    own = {name for name, fn in vars(toy.ToyBackend).items() if inspect.isfunction(fn) and name != "__init__"}
    assert own == required | {"describe"}
    assert not hasattr(toy.ToyArray, "ndim") and not hasattr(toy.ToyArray, "dtype")


# -- plugin code that raises BaseException, name conflicts, strict mode (issues 13 and 14) -----------------------
def _module_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    """A real module ``name`` on sys.path, announced by an entry point of the same name."""
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    _with_fake_entry_point(monkeypatch, name, name)


def test_system_exit_at_plugin_import_is_that_plugins_failure(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _module_plugin(tmp_path, monkeypatch, "ember_test_exiting_plugin", "raise SystemExit(3)\n")
    assert Device.flex() is Device("flex")  # the first device lookup survives
    record = next(p for p in plugins.plugins if p.name == "ember_test_exiting_plugin")
    assert record.error == "import failed: SystemExit: 3"


def test_keyboard_interrupt_at_plugin_import_propagates(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _module_plugin(tmp_path, monkeypatch, "ember_test_interrupted_plugin", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        plugins.ensure_loaded()
    # nothing half-registered stays behind: once the plugin is gone, the next lookup loads everything once
    assert not plugins._loaded and plugins.plugins == [] and plugins.backends == {}
    with_plugin = manager.metadata.entry_points
    monkeypatch.setattr(manager.metadata, "entry_points", lambda **kw: [
        ep for ep in with_plugin(**kw) if ep.name != "ember_test_interrupted_plugin"])
    assert Device.flex() is Device("flex")
    names = [p.name for p in plugins.plugins]
    assert names.count("flex") == 1 and not any(p.error for p in plugins.plugins)


def test_system_exit_in_a_hook_or_availability_check_is_caught(plugins: manager.PluginRegistry) -> None:
    class Exiting:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            raise SystemExit("bye")

    plugins.register_plugin(Exiting(), name="exiting")
    assert "SystemExit: bye" in next(p for p in plugins.plugins if p.name == "exiting").error

    def gone() -> int:
        raise SystemExit(1)

    class Gone:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            register("gone", lambda index=0: None, contract=CONTRACT_VERSION, kind="gpu", is_available=gone)

    plugins.register_plugin(Gone(), name="gone")
    assert plugins.backend("gone").device_count() == 0
    assert Device.default() is Device("flex")


def _hijacker(*names: str) -> Any:
    class Plugin:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            for name in names:
                register(name, lambda index=0: None, contract=CONTRACT_VERSION, kind="gpu", priority=99,
                         description=f"not the real {name}")

    return Plugin()


def test_a_plugin_cannot_take_over_flex(plugins: manager.PluginRegistry, caplog: pytest.LogCaptureFixture) -> None:
    # registered before discovery, so flex's own plugin comes second: the owner (entry point "flex") still wins
    with caplog.at_level(logging.WARNING, logger="ember.plugins"):
        plugins.register_plugin(_hijacker("flex", "evilgpu"), name="evil")
        plugins.ensure_loaded()
    assert plugins.backend("flex").plugin == "flex" and plugins.backend("evilgpu").plugin == "evil"
    assert [(c.what, c.name, c.winner, c.loser) for c in plugins.conflicts] == [("backend", "flex", "flex", "evil")]
    assert "owns the name" in plugins.conflicts[0].reason
    assert next(p for p in plugins.plugins if p.name == "evil").conflicts == ["backend 'flex'"]
    assert any("conflict" in r.getMessage() and "'evil'" in r.getMessage() for r in caplog.records)
    assert Device.flex().stack.name.split("+")[0] == "flex"
    info = ember.info()
    assert info["conflicts"] == [{"what": "backend", "name": "flex", "winner": "flex", "loser": "evil",
                                  "reason": "the plugin named 'flex' owns the name"}]
    assert any(e.startswith("name conflict: backend 'flex'") for e in info["errors"])


def test_otherwise_the_first_registration_wins(plugins: manager.PluginRegistry) -> None:
    plugins.register_plugin(_backend_plugin("shared", priority=1), name="first")
    plugins.register_plugin(_hijacker("shared"), name="second")
    assert plugins.backend("shared").plugin == "first"
    assert [(c.winner, c.loser, c.reason) for c in plugins.conflicts] == [
        ("first", "second", "it registered the name first")]


def test_a_conflict_is_fatal_when_strict(plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    plugins.ensure_loaded()
    monkeypatch.setenv("EMBER_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"conflict: backend 'flex' is registered by plugins 'flex' and 'evil'"):
        plugins.register_plugin(_hijacker("flex"), name="evil")
    assert plugins.backend("flex").plugin == "flex"


def test_strict_mode_keeps_the_first_error(plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_STRICT_PLUGINS", "1")
    _with_fake_entry_point(monkeypatch, "ghost", "ember_ghost_plugin_that_does_not_exist.plugin")
    messages = []
    for lookup in (Device.flex, lambda: Device.parse("flex+autodiff"), Device.default, plugins.ensure_loaded):
        with pytest.raises(PluginError) as err:
            lookup()
        messages.append(str(err.value))
    assert len(set(messages)) == 1 and messages[0].startswith("ember plugin 'ghost'")
    assert "already registered" not in messages[0]
    names = [p.name for p in plugins.plugins]
    assert len(names) == len(set(names)) and "flex" in names  # every plugin recorded once, none twice
    assert [p.name for p in plugins.plugins if p.error] == ["ghost"]


# -- install hints name only what exists ----------------------------------------------------------------------------
def _pyproject_extras() -> dict[str, set[str]]:
    import tomllib

    found = {}
    for dist, folder in (("ember", "ember"), ("ember-core", "ember-core")):
        data = tomllib.loads((ROOT / "packages" / folder / "pyproject.toml").read_text())
        found[dist] = set(data["project"]["optional-dependencies"])
    return found


_PIP_EXTRA = re.compile(r"pip install '([A-Za-z0-9_.-]+)\[([A-Za-z0-9_,.-]+)\]'")


def _check_hint(text: str, extras: dict[str, set[str]]) -> list[tuple[str, str]]:
    named = _PIP_EXTRA.findall(text)
    for dist, extra in named:
        assert dist in extras and extra in extras[dist], f"hint names a missing extra {dist}[{extra}]: {text}"
    return named


@pytest.mark.parametrize("name", ["flex", "autodiff", "fusion", "opencl", "toy", "cuda", "rocm", "wgpu", "remote",
                                  "router", "lora", "linalg", "test", "all", "plot", "nosuchthing"])
def test_every_install_hint_names_an_existing_extra(plugins: manager.PluginRegistry, name: str) -> None:
    extras = _pyproject_extras()
    plugins.ensure_loaded()
    for what in ("device", "decorator"):
        hint = manager.install_hint(name, what)
        named = _check_hint(hint, extras)
        if name in ("test", "all", "plot", "nosuchthing"):  # extras that install no plugin, or none at all
            assert not named and hint == f"no plugin provides this {what}; see docs/plugins"
    if name not in plugins.backends:
        with pytest.raises(PluginError) as err:
            Device(name)._checked()
        _check_hint(str(err.value), extras)
    if name not in plugins.decorators and not device_mod.is_device_attribute(name):
        with pytest.raises(AttributeError) as attr_err:
            getattr(Device.flex(), name)
        _check_hint(str(attr_err.value), extras)


def test_core_only_install_hints_name_core_extras(plugins: manager.PluginRegistry,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real_metadata, real_eps = manager.metadata.metadata, manager.metadata.entry_points

    def metadata_without_meta(dist: str) -> Any:
        if dist == "ember":
            raise metadata.PackageNotFoundError(dist)
        return real_metadata(dist)

    # ember-core with flex only: no meta package, no autodiff plugin installed
    monkeypatch.setattr(manager.metadata, "metadata", metadata_without_meta)
    monkeypatch.setattr(manager.metadata, "entry_points",
                        lambda **kw: [ep for ep in real_eps(**kw) if ep.name == "flex"])
    hint = manager.install_hint("autodiff", "decorator")
    assert hint == "install its plugin with pip install 'ember-core[autodiff]'"
    _check_hint(hint, _pyproject_extras())
    with pytest.raises(AttributeError, match=re.escape("pip install 'ember-core[autodiff]'")):
        Device.flex().autodiff  # noqa: B018
    # the meta package installed: its extra is named
    monkeypatch.setattr(manager.metadata, "metadata", real_metadata)
    assert manager.install_hint("autodiff", "decorator") == "install its plugin with pip install 'ember[autodiff]'"


def test_hints_written_into_the_sources_name_existing_extras() -> None:
    """Hand-written hints in core and the plugins (not only the computed ones) must name real extras."""
    extras = _pyproject_extras()
    roots = [ROOT / "packages", ROOT / "plugins"]
    checked = 0
    for root in roots:
        for path in root.rglob("*.py"):
            if "tests" in path.parts:
                continue
            checked += len(_check_hint(path.read_text(encoding="utf-8"), extras))
    assert checked >= 1  # the scan sees the hints that exist (e.g. the autodiff one)


def test_a_plugin_asking_for_devices_while_loading_does_not_restart_discovery(
    plugins: manager.PluginRegistry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    body = (
        "from ember.plugins import manager\n"
        "SEEN = sorted(manager.registry.ensure_loaded().backends)  # while discovery is importing this module\n"
    )
    _module_plugin(tmp_path, monkeypatch, "ember_test_eager_plugin", body)
    plugins.ensure_loaded()
    names = [p.name for p in plugins.plugins]
    assert len(names) == len(set(names)) and "ember_test_eager_plugin" in names and "flex" in names
    assert not any(p.error for p in plugins.plugins)
    import ember_test_eager_plugin  # type: ignore[import-not-found]

    # entry points load in name order: autodiff before it, flex after it
    assert "flex" not in ember_test_eager_plugin.SEEN
