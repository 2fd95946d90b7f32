"""The cuda plugin without a GPU: registration, the reason a missing device gives, `ember info` in a fresh process
(the detection it shares with the other CuPy plugin is tested in ember-cupy's tests)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

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
