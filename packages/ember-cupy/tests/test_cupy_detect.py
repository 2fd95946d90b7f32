"""ember_cupy.detect, the device detection ember-cuda and ember-rocm share, without a GPU: the reasons a device is
missing, the pip line, the facts `ember info` shows, with a stand-in CuPy module (the real one needs a driver)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

from ember_cupy import detect

PLATFORMS = ("cuda", "rocm")


@pytest.fixture(autouse=True)
def _fresh_probe() -> Iterator[None]:
    detect._probe.cache_clear()
    yield
    detect._probe.cache_clear()


def _fake_cupy(count: int, is_hip: bool) -> Any:
    """A stand-in for the cupy module: what detect.py calls on it, with the values a driver would return."""
    props = {"name": b"Stand-in GPU", "major": 9, "minor": 0, "gcnArchName": b"gfx90a",
             "totalGlobalMem": 80 * 2**30}
    runtime = types.SimpleNamespace(
        is_hip=is_hip, getDeviceCount=lambda: count, runtimeGetVersion=lambda: 12040 if not is_hip else 60032830,
        driverGetVersion=lambda: 12080 if not is_hip else 60032830, getDeviceProperties=lambda i: props)
    return types.SimpleNamespace(__version__="14.0.0", cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_cupy_missing_hint_has_the_pip_line(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    monkeypatch.setattr(detect, "cupy_installed", lambda: False)
    assert "pip install cupy-" in detect.install_hint(platform)
    assert "pip install cupy-" in detect.unavailable_reason(platform)
    assert "pip install" in detect.facts(platform)["reason"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_wrong_cupy_build_is_named(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    monkeypatch.setattr(detect, "cupy_installed", lambda: True)
    monkeypatch.setattr(detect, "driver_present", lambda p: True)
    monkeypatch.setattr(detect, "_cupy", lambda: _fake_cupy(2, is_hip=platform == "cuda"))  # the other vendor's
    assert detect.device_count(platform) == 0
    assert "build" in detect.unavailable_reason(platform)


@pytest.mark.parametrize(("platform", "described"), [("cuda", "compute capability 9.0"), ("rocm", "gfx arch gfx90a")])
def test_devices_and_facts_with_a_driver(monkeypatch: pytest.MonkeyPatch, platform: str, described: str) -> None:
    monkeypatch.setattr(detect, "cupy_installed", lambda: True)
    monkeypatch.setattr(detect, "driver_present", lambda p: True)
    monkeypatch.setattr(detect, "_cupy", lambda: _fake_cupy(2, is_hip=platform == "rocm"))
    assert detect.device_count(platform) == 2
    assert detect.unavailable_reason(platform) == ""
    info = detect.facts(platform)
    assert info["devices"] == [f"Stand-in GPU [{described}, 80.0 GiB]"] * 2
    assert info["runtime"] and info["driver"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_runtime_without_device_reports_the_error(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    fake = _fake_cupy(0, is_hip=platform == "rocm")

    def no_device() -> int:
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake.cuda.runtime.getDeviceCount = no_device
    monkeypatch.setattr(detect, "cupy_installed", lambda: True)
    monkeypatch.setattr(detect, "driver_present", lambda p: True)
    monkeypatch.setattr(detect, "_cupy", lambda: fake)
    assert detect.device_count(platform) == 0
    assert "cudaErrorNoDevice" in detect.unavailable_reason(platform)


def _registered(platform: str) -> dict[str, Any]:
    """What the hooks ember-cuda / ember-rocm are made of register for ``platform``."""
    from ember.plugins import CONTRACT_VERSION
    from ember_cupy.plugin_hooks import backend_hooks

    register_backends, plugin_info = backend_hooks(platform, f"{platform} test backend", CONTRACT_VERSION)
    got: dict[str, Any] = {}
    register_backends(lambda name, factory, **kw: got.update(name=name, factory=factory, **kw))
    got["info"] = plugin_info()
    return got


@pytest.mark.parametrize("platform", PLATFORMS)
def test_hooks_register_a_gpu_backend_that_names_why_it_is_missing(monkeypatch: pytest.MonkeyPatch,
                                                                   platform: str) -> None:
    from ember.errors import DeviceError

    spec = _registered(platform)
    assert (spec["name"], spec["kind"], spec["description"]) == (platform, "gpu", f"{platform} test backend")
    assert spec["install_hint"] and isinstance(spec["info"], dict)
    monkeypatch.setattr(detect, "driver_present", lambda p: False)
    assert spec["is_available"]() == 0
    with pytest.raises(DeviceError, match=rf"Device\.{platform}\(0\): only 0 {platform} device\(s\) found \(.*driver"):
        spec["factory"](0)
    monkeypatch.setattr(detect, "cupy_installed", lambda: False)
    detect._probe.cache_clear()
    with pytest.raises(DeviceError, match=r"CuPy is not installed: pip install cupy-"):
        spec["factory"](0)
    with pytest.raises(DeviceError, match=f"{platform} takes no options"):
        spec["factory"](0, fast=True)
