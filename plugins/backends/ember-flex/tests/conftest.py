"""flex's own tests run with ember-core and ember-flex alone (``nox -s core_flex``) as well as with every plugin.

Some of them check flex's kernels for core's extension ops through gradients or fusion, on devices such as
``flex+autodiff`` or ``flex+fusion(False)``. Where such a decorator is not installed the device cannot be made:
that test is reported as skipped, naming the missing decorator, instead of failing. No plugin is imported here;
only the device string's parse error is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ember.errors import DeviceError

_MISSING = "is not an installed decorator"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    except DeviceError as exc:
        if _MISSING not in str(exc):
            raise
        pytest.skip(f"needs a decorator this environment lacks: {exc}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[Any]:
    try:
        return (yield)
    except DeviceError as exc:  # a fixture that builds the device
        if _MISSING not in str(exc):
            raise
        pytest.skip(f"needs a decorator this environment lacks: {exc}")
