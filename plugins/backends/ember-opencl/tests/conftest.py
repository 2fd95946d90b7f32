"""The plugin's own tests exercise the OpenCL backend itself, so its devices are not fused here: fusion would wrap
``Device.opencl(0).stack``. Fused OpenCL runs in the conformance kit and in test_fusion.py.

A session fixture rather than a module-level environment change: pytest imports this file even in runs that ignore
these tests (the main run lists this folder in testpaths), and there fusion must stay on."""

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _unfused_opencl_devices() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_FUSION", "0")
        yield
