"""Autotune results of the WebGPU backend, persisted per adapter as ember-opencl persists its own.

Layout under the ember cache directory (``$EMBER_CACHE_DIR``, else the user cache directory for ``ember``)::

    <cache>/wgpu/<adapter_key>/tune.json      {"format": 1, "entries": {op: {shape key: config}}}

The adapter key (:func:`adapter_key`) is a readable slug of the adapter's name plus a hash of everything that
changes which kernel is fastest or whether it runs: vendor, device, description (driver version), backend and
adapter type, and the wgpu-native version. The file format is that of ember-opencl's ``tune.json``: writes are
atomic and merged with what other processes wrote meanwhile (under an advisory lock on POSIX); an unreadable file
counts as empty and an unwritable directory keeps results in memory only, so tuning never fails a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import pathlib
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ember.errors import ValueRangeError

from .errors import AutotuneError

try:  # POSIX advisory locks for the read-merge-write of the tune file; elsewhere the merge is best effort
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("ember.wgpu")

_FORMAT = 1


def default_cache_dir() -> pathlib.Path:
    """``$EMBER_CACHE_DIR`` if set, else the user cache directory for ``ember`` (wgpu's files go to ``wgpu/``)."""
    env = os.environ.get("EMBER_CACHE_DIR")
    if env:
        return pathlib.Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:  # pragma: no cover - platformdirs comes with ember-core's environment
        return pathlib.Path.home() / ".cache" / "ember"
    return pathlib.Path(platformdirs.user_cache_dir("ember"))


def adapter_key(info: dict[str, Any], wgpu_version: str) -> str:
    """A stable, filesystem-safe id of an adapter: ``<slug of its name>-<hash of vendor, device, driver, backend,
    adapter type and wgpu version>``."""
    parts = [str(info.get(k, "")) for k in ("vendor", "vendor_id", "device", "device_id", "description",
                                             "architecture", "backend_type", "adapter_type")]
    digest = hashlib.sha256("\0".join([*parts, wgpu_version]).encode()).hexdigest()[:20]
    slug = re.sub(r"[^a-z0-9]+", "-", str(info.get("device", "")).lower()).strip("-")[:40] or "adapter"
    return f"{slug}-{digest}"


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class TuneStore:
    """Autotune winners of one adapter: ``{op: {key: config}}`` in ``<cache>/wgpu/<adapter_key>/tune.json``."""

    def __init__(self, cache_dir: pathlib.Path | None, key: str) -> None:
        root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.adapter_key = key
        self.path = root / "wgpu" / key / "tune.json"
        self._entries: dict[str, dict[str, dict[str, Any]]] = {}
        self._stamp: tuple[int, int] | None = None
        self._persist = True
        self._lock = threading.RLock()
        self._refresh()

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
        except OSError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            for op, table in self._read_file().items():
                self._entries.setdefault(op, {}).update(table)

    def _read_file(self) -> dict[str, dict[str, dict[str, Any]]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.debug("ember-wgpu: ignoring unreadable tune file %s: %s", self.path, err)
            return {}
        entries = data.get("entries") if isinstance(data, dict) and data.get("format") == _FORMAT else None
        if not isinstance(entries, dict):
            return {}
        return {op: {k: v for k, v in table.items() if isinstance(v, dict)}
                for op, table in entries.items() if isinstance(table, dict)}

    def get(self, op: str, key: str) -> dict[str, Any] | None:
        """The stored config of ``(op, key)`` or None (a miss rereads the file if another process changed it)."""
        with self._lock:
            hit = self._entries.get(op, {}).get(key)
            if hit is None:
                self._refresh()
                hit = self._entries.get(op, {}).get(key)
            return dict(hit) if hit is not None else None

    def put(self, op: str, key: str, value: dict[str, Any]) -> None:
        """Store ``value`` for ``(op, key)`` in memory and on disk (merged with the file's current content)."""
        if not isinstance(value, dict):
            raise ValueRangeError(f"TuneStore.put({op!r}, {key!r}): value must be a dict, got {type(value).__name__}")
        blob = json.loads(json.dumps(value, sort_keys=True))
        with self._lock:
            self._entries.setdefault(op, {})[key] = blob
            if not self._persist:
                return
            try:
                with self._file_lock():
                    merged = self._read_file()
                    for o, table in self._entries.items():
                        merged.setdefault(o, {}).update(table)
                    text = json.dumps({"format": _FORMAT, "entries": merged}, indent=1, sort_keys=True)
                    _atomic_write(self.path, text.encode("utf-8"))
                    self._entries = merged
                    st = self.path.stat()
                    self._stamp = (st.st_mtime_ns, st.st_size)
            except OSError as err:
                self._persist = False
                log.debug("ember-wgpu: cannot write tune file %s (%s); results stay in memory", self.path, err)

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover - Windows
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def tune(self, op: str, key: str, candidates: Sequence[dict[str, Any]],
             run: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
        """The fastest of ``candidates`` for ``(op, key)``: a stored winner still among the candidates is returned
        untimed; else ``run(candidate)`` times each (seconds, warmed up) and the winner is stored. A candidate
        whose run raises or returns a non-finite time is skipped; if all fail, :class:`AutotuneError`."""
        if not candidates:
            raise ValueRangeError(f"autotune {op!r} for {key!r}: no candidate configurations given")
        stored = self.get(op, key)
        if stored is not None and stored in candidates:
            return stored
        best: dict[str, Any] | None = None
        best_t = math.inf
        failures: list[str] = []
        for cand in candidates:
            try:
                t = float(run(cand))
            except Exception as err:  # a candidate that fails (shader, limits) is just not eligible
                failures.append(f"{cand}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
                continue
            if not math.isfinite(t) or t < 0:
                failures.append(f"{cand}: run() returned {t!r}")
                continue
            log.debug("ember-wgpu: autotune %s %s: %s took %.3g s", op, key, cand, t)
            if t < best_t:
                best, best_t = cand, t
        if best is None:
            raise AutotuneError(f"autotune {op!r} for {key!r} on adapter {self.adapter_key}: all "
                                f"{len(candidates)} candidates failed:\n  " + "\n  ".join(failures[:8]))
        winner = dict(best)
        self.put(op, key, winner)
        return winner


__all__ = ["AutotuneError", "TuneStore", "adapter_key", "default_cache_dir"]
