"""Fixtures shared by the cross-plugin tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ember import device as device_mod
from ember import dispatch
from ember.plugins import manager


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[manager.PluginRegistry]:
    """A fresh, empty plugin registry (it discovers the installed plugins again on first use) and empty device
    caches for one test; everything is restored afterwards.

    The registry is swapped (not reset) so devices and tensors made by other tests keep working: interned
    devices only lose their resolved stack, which they rebuild on next use.
    """
    for var in ("EMBER_DISABLE_PLUGINS", "EMBER_STRICT_PLUGINS", "EMBER_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    fresh = manager.PluginRegistry()
    monkeypatch.setattr(manager, "registry", fresh)
    saved_cache = dict(dispatch._backend_cache)
    saved_stacks = {key: dev._stack for key, dev in device_mod._interned.items()}
    saved_default = device_mod._default
    dispatch._backend_cache.clear()
    for dev in device_mod._interned.values():
        dev._stack = None
    device_mod._default = None
    try:
        yield fresh
    finally:
        dispatch._backend_cache.clear()
        dispatch._backend_cache.update(saved_cache)
        for key, dev in device_mod._interned.items():
            dev._stack = saved_stacks.get(key)  # devices first made in this test resolve again later
        device_mod._default = saved_default
