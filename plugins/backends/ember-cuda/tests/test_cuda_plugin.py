"""The cuda plugin without a GPU: registration, device detection and its reasons, `ember info` facts, and the
Python side of detection with a stand-in CuPy module (the real one needs a driver)."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import ember
from ember import Device
from ember.errors import DeviceError
from ember.plugins.manager import registry
from ember_cupy import detect

PLATFORM = "cuda"


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


def test_registered_as_a_gpu_backend() -> None:
    spec = registry.backend(PLATFORM)
    assert spec.kind == "gpu"
    assert spec.install_hint  # Device.cuda(i) names what is missing


def test_without_driver_device_raises_and_default_skips_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "driver_present", lambda platform: False)
    monkeypatch.delenv("EMBER_DEVICE", raising=False)
    assert detect.device_count(PLATFORM) == 0
    assert "driver" in detect.unavailable_reason(PLATFORM)
    with pytest.raises(DeviceError, match=r"Device\.cuda\(0\): only 0 cuda device"):
        getattr(Device, PLATFORM)(0)
    assert Device.default().kind != PLATFORM


def test_factory_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "cupy_installed", lambda: False)
    from ember_cuda.plugin import _factory

    with pytest.raises(DeviceError, match=r"CuPy is not installed: pip install cupy-"):
        _factory(0)
    with pytest.raises(DeviceError, match="takes no options"):
        _factory(0, fast=True)


def test_cupy_missing_hint_has_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "cupy_installed", lambda: False)
    assert "pip install cupy-" in detect.install_hint(PLATFORM)
    assert "pip install cupy-" in detect.unavailable_reason(PLATFORM)
    info = detect.facts(PLATFORM)
    assert "pip install" in info["reason"]


def test_wrong_cupy_build_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "cupy_installed", lambda: True)
    monkeypatch.setattr(detect, "driver_present", lambda platform: True)
    monkeypatch.setattr(detect, "_cupy", lambda: _fake_cupy(2, is_hip=True))
    assert detect.device_count(PLATFORM) == 0
    assert "build" in detect.unavailable_reason(PLATFORM)


def test_devices_and_facts_with_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "cupy_installed", lambda: True)
    monkeypatch.setattr(detect, "driver_present", lambda platform: True)
    monkeypatch.setattr(detect, "_cupy", lambda: _fake_cupy(2, is_hip=PLATFORM == "rocm"))
    assert detect.device_count(PLATFORM) == 2
    assert detect.unavailable_reason(PLATFORM) == ""
    info = detect.facts(PLATFORM)
    assert info["devices"] == ["Stand-in GPU [compute capability 9.0, 80.0 GiB]"] * 2
    assert info["runtime"] and info["driver"]


def test_runtime_without_device_reports_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_cupy(0, is_hip=PLATFORM == "rocm")

    def no_device() -> int:
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake.cuda.runtime.getDeviceCount = no_device
    monkeypatch.setattr(detect, "cupy_installed", lambda: True)
    monkeypatch.setattr(detect, "driver_present", lambda platform: True)
    monkeypatch.setattr(detect, "_cupy", lambda: fake)
    assert detect.device_count(PLATFORM) == 0
    assert "cudaErrorNoDevice" in detect.unavailable_reason(PLATFORM)


def test_import_and_info_work_without_a_gpu() -> None:
    """A fresh process: `import ember` does not import CuPy, `ember info` lists the plugin with its reason."""
    code = ("import sys, ember; from ember import Device; Device.default(); "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if not detect.driver_present(PLATFORM):
        assert out.stdout.strip() == "False"
    info = subprocess.run([sys.executable, "-c", "import sys; from ember.cli import main; sys.exit(main(['info']))"],
                          capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert f"  {PLATFORM}:" in info.stdout


def test_ember_cuda_module_queries() -> None:
    if PLATFORM == "cuda" and detect.device_count("cuda") == 0:
        assert ember.cuda.is_available() is False
        assert ember.cuda.device_count() == 0
