"""Autotune results of the WebGPU backend, persisted per adapter as ember-opencl persists its own.

Layout under the ember cache directory (``$EMBER_CACHE_DIR``, else the user cache directory for ``ember``)::

    <cache>/wgpu/<adapter_key>/tune.json      {"format": 1, "entries": {op: {shape key: config}}}

The adapter key (:func:`adapter_key`) is a readable slug of the adapter's name plus a hash of everything that
changes which kernel is fastest or whether it runs: vendor, device, description (driver version), backend and
adapter type, and the wgpu-native version. The store and its file format are core's (:mod:`ember.utils.tune_store`,
shared with ember-opencl): writes are atomic and merged with what other processes wrote meanwhile; an unreadable
file counts as empty and an unwritable directory keeps results in memory only, so tuning never fails a run.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from typing import Any

from ember.utils import tune_store
from ember.utils.tune_store import cache_dir as default_cache_dir

from .errors import AutotuneError


def adapter_key(info: dict[str, Any], wgpu_version: str) -> str:
    """A stable, filesystem-safe id of an adapter: ``<slug of its name>-<hash of vendor, device, driver, backend,
    adapter type and wgpu version>``."""
    parts = [str(info.get(k, "")) for k in ("vendor", "vendor_id", "device", "device_id", "description",
                                             "architecture", "backend_type", "adapter_type")]
    digest = hashlib.sha256("\0".join([*parts, wgpu_version]).encode()).hexdigest()[:20]
    slug = re.sub(r"[^a-z0-9]+", "-", str(info.get("device", "")).lower()).strip("-")[:40] or "adapter"
    return f"{slug}-{digest}"


class TuneStore(tune_store.TuneStore):
    """Autotune winners of one adapter: ``{op: {key: config}}`` in ``<cache>/wgpu/<adapter_key>/tune.json``."""

    def __init__(self, cache_dir: pathlib.Path | None, key: str) -> None:
        root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.adapter_key = key
        super().__init__(root / "wgpu" / key / "tune.json", owner="ember-wgpu", device=key, error=AutotuneError)


__all__ = ["AutotuneError", "TuneStore", "adapter_key", "default_cache_dir"]
