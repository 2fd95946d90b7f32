"""The host device is a capability, not a name: a backend registers ``host=True`` and core's host-side paths
(``.cpu()``, ``ember.from_numpy``, ``records.load_into``, the device string ``"cpu"``, tensor ``repr``) use whichever
installed backend declared it. Other backends here are built from the installed plugins' own factories (taken
from the registry, never imported), so no plugin is imported by these tests."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device, DeviceError
from ember.plugins import CONTRACT_VERSION, hookimpl, manager


@pytest.fixture(scope="module")
def factories() -> dict[str, Callable[..., Any]]:
    """The installed backends' factories by name (from the real registry, before any test swaps it)."""
    manager.registry.ensure_loaded()
    return {name: spec.factory for name, spec in manager.registry.backends.items()}


def _backend_plugin(name: str, factory: Callable[..., Any], **extra: Any) -> Any:
    """A programmatic plugin registering ``name`` with an installed backend's factory."""

    class Plugin:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            register(name, factory, contract=CONTRACT_VERSION, description=f"test backend {name}", **extra)

    return Plugin()


def _host_backends() -> list[str]:
    manager.registry.ensure_loaded()
    return sorted(name for name, spec in manager.registry.backends.items() if spec.host)


# -- the installed plugins -----------------------------------------------------------------------------------------
def test_the_installed_host_backend_is_the_one_that_declares_it() -> None:
    hosts = _host_backends()
    if not hosts:
        pytest.skip("no installed backend registers host=True")
    host = Device.host()
    assert host.kind in hosts and not host.decorators and host.index == 0
    # the example backend boxes its arrays and copies in from_numpy: it does not claim host memory, nor does a
    # device backend
    for name in ("toy", "opencl"):
        if name in manager.registry.backends:
            assert not manager.registry.backends[name].host, name


def test_host_paths_use_the_host_device() -> None:
    host = Device.host()
    a = np.arange(4.0)
    shared = ember.from_numpy(a)
    assert shared.device is host
    a[0] = 42.0
    assert shared.tolist()[0] == 42.0  # zero-copy: what host=True promises
    assert shared.numpy() is not None and np.shares_memory(shared.numpy(), a)
    for spec in (None, *[n for n in manager.registry.backends if n != host.kind]):
        try:
            x = ember.tensor([1.0, 2.0], device=spec)
        except ember.EmberError:
            continue  # a backend without a device here
        assert x.cpu().device is host
        assert x.to("cpu").device is host
        np.testing.assert_array_equal(x.cpu().numpy(), [1.0, 2.0])
    model = ember.nn.Linear(2, 3)
    assert all(p.device is host for p in model.cpu().parameters())


def test_cpu_is_the_host_device_in_device_strings() -> None:
    host = Device.host()
    assert Device.parse("cpu") is host
    assert Device.parse("CPU:0") is host
    assert ember.device.as_device("cpu") is host
    if "autodiff" in manager.registry.decorators:
        assert Device.parse("cpu+autodiff") is host.autodiff()
        assert Device.parse("cpu + autodiff(checkpointing=balanced)") is host.autodiff(checkpointing="balanced")
    with pytest.raises(DeviceError, match=re.escape(f"'cpu' is the host device {host} and has only index 0")):
        Device.parse("cpu:1")
    with pytest.raises(DeviceError, match="'cpu:x'.*not an int"):
        Device.parse("cpu:x")


def test_repr_names_every_device_but_the_host() -> None:
    host = Device.host()
    assert "device=" not in repr(ember.ones(2, device=host))
    if "autodiff" in manager.registry.decorators:
        assert f"device={host.autodiff()}" in repr(ember.ones(2, device=host.autodiff()))
    if "toy" in manager.registry.backends:
        assert "device=toy" in repr(ember.ones(2, device="toy"))


# -- registries with other host backends ---------------------------------------------------------------------------
def test_another_host_backend_of_higher_priority_takes_over(plugins: manager.PluginRegistry,
                                                            factories: dict[str, Callable[..., Any]]) -> None:
    if "toy" not in factories:
        pytest.skip("the example backend (toy) is not installed")
    plugins.register_plugin(_backend_plugin("hostly", factories["toy"], kind="cpu", priority=5, host=True),
                            name="hostly")
    host = Device.host()
    assert host is Device("hostly", 0)
    assert Device.parse("cpu") is host
    x = ember.tensor([[1.0, 2.0], [3.0, 4.0]], device="toy")
    moved = x.cpu()
    assert moved.device is host
    np.testing.assert_array_equal(moved.numpy(), [[1.0, 2.0], [3.0, 4.0]])
    assert ember.from_numpy(np.ones(3, np.float32)).device is host
    assert "device=" not in repr(moved) and "device=toy" in repr(x)


def test_records_load_into_goes_through_the_host_device(plugins: manager.PluginRegistry,
                                                        factories: dict[str, Callable[..., Any]],
                                                        tmp_path: Path) -> None:
    if "toy" not in factories:
        pytest.skip("the example backend (toy) is not installed")
    plugins.register_plugin(_backend_plugin("hostly", factories["toy"], kind="cpu", priority=5, host=True),
                            name="hostly")
    model = ember.nn.Linear(3, 2).to("toy")
    path = tmp_path / "linear.ember"
    ember.records.save(model.state_dict(), path)
    other = ember.nn.Linear(3, 2).to("toy")
    ember.records.load_into(other, path)
    for (name, p), q in zip(model.state_dict().items(), other.state_dict().values()):
        assert q.device is Device("toy", 0), name
        np.testing.assert_array_equal(q.numpy(), p.numpy())


def test_ties_prefer_a_real_cpu_then_the_first_name(plugins: manager.PluginRegistry,
                                                    factories: dict[str, Callable[..., Any]]) -> None:
    if "toy" not in factories:
        pytest.skip("the example backend (toy) is not installed")
    plugins.register_plugin(_backend_plugin("zz-emulated", factories["toy"], kind="emulated", priority=7,
                                            host=True), name="zz-emulated")
    assert Device.host() is Device("zz-emulated", 0)
    plugins.register_plugin(_backend_plugin("zz-cpu", factories["toy"], kind="cpu", priority=7, host=True),
                            name="zz-cpu")
    assert Device.host() is Device("zz-cpu", 0)  # same priority: a real CPU before an emulated one
    plugins.register_plugin(_backend_plugin("aa-cpu", factories["toy"], kind="cpu", priority=7, host=True),
                            name="aa-cpu")
    assert Device.host() is Device("aa-cpu", 0)  # full tie: name order, whatever the registration order
    plugins.register_plugin(_backend_plugin("absent", factories["toy"], kind="cpu", priority=9, host=True,
                                            is_available=lambda: 0), name="absent")
    assert Device.host() is Device("aa-cpu", 0)  # a host backend without a device is not a candidate


def test_a_backend_named_cpu_keeps_its_name(plugins: manager.PluginRegistry,
                                            factories: dict[str, Callable[..., Any]]) -> None:
    if "toy" not in factories:
        pytest.skip("the example backend (toy) is not installed")
    plugins.register_plugin(_backend_plugin("cpu", factories["toy"]), name="cpu-plugin")
    assert Device.parse("cpu") is Device("cpu", 0)
    assert Device.parse("cpu") is not Device.host()


def test_without_a_host_backend_host_paths_raise_a_device_error(plugins: manager.PluginRegistry,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    real = manager.PluginRegistry()
    real.ensure_loaded()
    hosts = [spec.plugin for spec in real.backends.values() if spec.host]
    if "toy" not in real.backends:
        pytest.skip("the example backend (toy) is not installed")
    monkeypatch.setenv("EMBER_DISABLE_PLUGINS", ",".join(hosts))
    installed = ", ".join(sorted(n for n, s in real.backends.items() if not s.host))
    with pytest.raises(DeviceError, match=re.escape(f"installed backends: {installed})")) as err:
        Device.host()
    msg = str(err.value)
    assert msg.startswith("no host device: no installed backend is registered with host=True")
    for name in hosts:  # the hint comes from the installed metadata: the disabled plugin is named
        assert f"the plugin {name!r}" in msg and "disabled by EMBER_DISABLE_PLUGINS" in msg
    x = ember.tensor([1.0, 2.0], device="toy")
    assert "device=toy" in repr(x)  # repr never raises for want of a host device
    with pytest.raises(DeviceError, match="no host device"):
        x.cpu()
    with pytest.raises(DeviceError, match="no host device"):
        ember.from_numpy(np.ones(2))
    with pytest.raises(DeviceError, match="no host device"):
        Device.parse("cpu+autodiff")


# -- named constructors: one per installed backend kind, none written into core -------------------------------------
def test_named_constructors_come_from_the_installed_kinds() -> None:
    manager.registry.ensure_loaded()
    for name in manager.registry.backends:
        if not name.isidentifier() or manager.registry.backends[name].device_count() < 1:
            continue
        dev = getattr(Device, name)()
        assert dev is Device(name, 0) and repr(dev) == f"Device.{name}()"
        assert eval(repr(dev), {"Device": Device}) is dev  # repr is the constructor call
    assert repr(Device("flex", 2)) == "Device.flex(2)"  # repr alone does not check the backend
    with pytest.raises(ember.PluginError, match="no backend named 'nosuchkind' is installed"):
        Device.nosuchkind(0)
    for name in ("Upper", "_private", "__wrapped__"):
        assert not hasattr(Device, name)
    assert repr(Device("a-b", 1)) == "Device('a-b', 1)"  # not an identifier: the plain constructor
