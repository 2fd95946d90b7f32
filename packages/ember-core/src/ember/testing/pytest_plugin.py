"""pytest plugin of the conformance kit (entry point ``pytest11: ember``), loaded by every pytest run in an
environment where ember is installed, so it does almost nothing unless ember's tests are running:

* ``--ember-device=SPEC`` (default: ``$EMBER_TEST_DEVICE``, else ember's default device, ``Device.default()``:
  ``$EMBER_DEVICE`` or the best installed device) names the device under test; nothing is resolved or imported at
  start-up, the device is created when the first test asks for it.
* fixtures ``device`` (the device under test, session scope) and ``rng`` (a numpy Generator seeded from the
  test's id, so every test is reproducible on its own);
* for the kit's own tests, and for other tests using ember when the device was chosen explicitly (option or
  environment variable), the device under test is ember's default device while they run (restored afterwards);
* marker ``requires_dtype(dtype, ...)``: skip with a reason when the device does not support a dtype;
* the warning filters the kit's tests need (numpy's floating-point RuntimeWarnings are expected there), so a
  backend's author running the kit from their own project sees only the warnings that mean something;
* a report-header line naming the device under test.
"""

from __future__ import annotations

import os
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_ENV = "EMBER_TEST_DEVICE"
_KIT_DIR = Path(__file__).resolve().parent

# The kit feeds inf, nan, zero divisors and out-of-range values on purpose and compares the results with PyTorch,
# which computes them silently. A backend built on numpy gets numpy's floating-point RuntimeWarnings for exactly
# those inputs ("invalid value encountered in subtract", ...), hundreds per run: expected, so the kit's own tests
# ignore them. They are added as marks, which pytest applies after ini and -W filters, so the kit is quiet
# wherever it runs (no project configuration needed) and even under -W error::RuntimeWarning; any other warning
# a backend raises still shows.
_KIT_WARNING_FILTERS = (
    "ignore:(divide by zero|invalid value|overflow|underflow) encountered:RuntimeWarning",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ember", "ember conformance kit")
    group.addoption(
        "--ember-device",
        action="store",
        default=None,
        metavar="SPEC",
        help=f"device the ember tests run on, e.g. cpu, cuda:1, flex+autodiff (default: ${_ENV}, else ember's "
        "default device: $EMBER_DEVICE or the best installed one)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires_dtype(*dtypes): skip unless the ember device under test supports every dtype given"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_kit_test(item):
            for spec in _KIT_WARNING_FILTERS:
                item.add_marker(pytest.mark.filterwarnings(spec))


def _spec(config: pytest.Config) -> str | None:
    """The device string chosen for the run, or None for ember's default device."""
    return config.getoption("--ember-device") or os.environ.get(_ENV) or None


def _explicit(config: pytest.Config) -> bool:
    return bool(config.getoption("--ember-device") or os.environ.get(_ENV))


def pytest_report_header(config: pytest.Config) -> str:
    how = "--ember-device" if config.getoption("--ember-device") else _ENV if os.environ.get(_ENV) else "default"
    # the default device is not resolved here: this runs in every pytest session of the environment
    return f"ember device under test: {_spec(config) or 'Device.default()'} ({how})"


def _device_for(config: pytest.Config) -> Any:
    cached = getattr(config, "_ember_device", None)
    if cached is not None:
        return cached
    import ember

    spec = _spec(config)
    try:
        dev = ember.Device.parse(spec) if spec is not None else ember.Device.default()
        dev.stack  # noqa: B018 - resolve now so a broken backend fails here, with the spec in the message
    except Exception as exc:
        what = repr(spec) if spec is not None else "(ember's default device)"
        pytest.fail(f"cannot create the device under test {what} (--ember-device): {type(exc).__name__}: {exc}",
                    pytrace=False)
    config._ember_device = dev  # type: ignore[attr-defined]
    return dev


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> Any:
    """The ember device under test (``--ember-device``)."""
    return _device_for(pytestconfig)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> Any:
    """A numpy Generator seeded from the test's node id: reproducible per test, different between tests."""
    import numpy as np

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="session")
def _ember_session_default_device(pytestconfig: pytest.Config) -> Iterator[Any]:
    from ember import device as device_mod

    dev = _device_for(pytestconfig)
    previous = device_mod._default
    device_mod.set_default_device(dev)
    yield dev
    device_mod._default = previous  # restore exactly, including "not chosen yet"


def _is_kit_test(item: pytest.Item) -> bool:
    path = getattr(item, "path", None)
    return path is not None and _KIT_DIR in Path(path).resolve().parents


def _uses_ember(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    if module is None:
        return False
    for v in vars(module).values():
        name = getattr(v, "__name__", "") if isinstance(v, types.ModuleType) else getattr(v, "__module__", "") or ""
        if name == "ember" or name.startswith("ember."):
            return True
    return False


@pytest.fixture(autouse=True)
def _ember_default_device(request: pytest.FixtureRequest) -> None:
    """Run ember's tests on the device under test; costs one attribute check for everyone else's tests."""
    item = request.node
    verdict = item.stash.get(_RELEVANT, None)
    if verdict is None:
        verdict = _is_kit_test(item) or (_explicit(request.config) and _uses_ember(item))
        item.stash[_RELEVANT] = verdict
    if verdict:
        request.getfixturevalue("_ember_session_default_device")


_RELEVANT = pytest.StashKey[bool]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    marks = list(item.iter_markers(name="requires_dtype"))
    if not marks:
        return
    from ember import dtypes

    dev = _device_for(item.config)
    for mark in marks:
        for d in mark.args:
            d = dtypes.as_dtype(d)
            if not dev.supports_dtype(d):
                pytest.skip(f"device {dev} does not support dtype {d.name} (requires_dtype)")
