"""Autotune results persisted per device: the store backends use to time kernel variants once and remember the winner.

A backend plugin makes one :class:`TuneStore` per device, at ``<cache>/<backend>/<device key>/tune.json`` under
:func:`cache_dir`, and calls :meth:`TuneStore.tune` with its candidate configurations and a function that times one::

    {"format": 1, "entries": {op: {shape key: config}}}

Writes are atomic (:func:`atomic_write`) and merged with what other processes wrote meanwhile (under an advisory
lock on POSIX); an unreadable file counts as empty and an unwritable directory keeps results in memory only, so
tuning never fails a run. ember-opencl and ember-wgpu share this format.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ember.errors import EmberError, ValueRangeError

try:  # POSIX advisory locks for the tune file's read-merge-write; elsewhere the merge is best effort
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("ember.tune")

#: the file format; bumped when the layout changes (old files are then read as empty)
FORMAT = 1

Entries = dict[str, dict[str, dict[str, Any]]]


class AutotuneError(EmberError, RuntimeError):
    """Every candidate configuration of an autotuned kernel failed (each failure is listed)."""


def cache_dir() -> pathlib.Path:
    """The ember cache directory: ``$EMBER_CACHE_DIR`` if set, else the user cache directory for ``ember``
    (backends keep their files in a folder of their own below it)."""
    env = os.environ.get("EMBER_CACHE_DIR")
    if env:
        return pathlib.Path(env).expanduser()
    import platformdirs

    return pathlib.Path(platformdirs.user_cache_dir("ember"))


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class TuneStore:
    """Autotune winners of one device: ``{op: {key: config}}`` in ``path`` (JSON).

    ``key`` names a shape class (the caller decides its granularity) and ``config`` is a JSON-serialisable dict
    (tile sizes, work-group sizes, ...). ``owner`` (``"ember-opencl"``) and ``device`` (its device key) name the
    store in log lines and errors; ``error`` is the exception class :meth:`tune` raises when every candidate fails.
    Safe to use from several threads and processes.
    """

    def __init__(self, path: pathlib.Path, *, owner: str, device: str,
                 error: type[Exception] = AutotuneError) -> None:
        self.path = pathlib.Path(path)
        self.owner = owner
        self.device = device
        self.error = error
        self._entries: Entries = {}
        self._stamp: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read
        self._persist = True
        self._lock = threading.RLock()
        self._refresh()

    def _refresh(self) -> None:
        """Merge the file's entries into memory if it changed since the last read (the file, being newer, wins)."""
        try:
            st = self.path.stat()
        except OSError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        for op, table in self._read_file().items():
            self._entries.setdefault(op, {}).update(table)

    def _read_file(self) -> Entries:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.debug("%s: ignoring unreadable tune file %s: %s", self.owner, self.path, err)
            return {}
        entries = data.get("entries") if isinstance(data, dict) and data.get("format") == FORMAT else None
        if not isinstance(entries, dict):
            return {}
        # Keep only well-formed entries so one bad record cannot poison lookups.
        return {op: {k: v for k, v in table.items() if isinstance(v, dict)}
                for op, table in entries.items() if isinstance(table, dict)}

    def get(self, op: str, key: str) -> dict[str, Any] | None:
        """The stored config for ``(op, key)``, or ``None``. A miss rereads the file if another process changed it."""
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
        try:
            blob = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError) as err:
            raise ValueRangeError(f"TuneStore.put({op!r}, {key!r}): value is not JSON-serialisable: {err}") from err
        with self._lock:
            self._entries.setdefault(op, {})[key] = json.loads(blob)
            if not self._persist:
                return
            try:
                with self._file_lock():
                    merged = self._read_file()
                    for o, table in self._entries.items():
                        merged.setdefault(o, {}).update(table)
                    text = json.dumps({"format": FORMAT, "entries": merged}, indent=1, sort_keys=True)
                    atomic_write(self.path, text.encode("utf-8"))
                    self._entries = merged
                    st = self.path.stat()
                    self._stamp = (st.st_mtime_ns, st.st_size)
            except OSError as err:
                self._persist = False
                log.debug("%s: cannot write tune file %s (%s); results stay in memory", self.owner, self.path, err)

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        # Serialises read-merge-write among processes on POSIX so that neither loses the other's entries.
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
        """The fastest of ``candidates`` for ``(op, key)``, timed once per device and then remembered.

        If a winner is stored (by this or an earlier process) and is still among ``candidates``, it is returned
        without timing. Otherwise ``run(candidate)`` is called for each candidate and must return its time in
        seconds (measure a warmed-up run: ``run`` should build and launch once before timing). Candidates whose
        ``run`` raises (a build failure, a work-group size the device refuses, out of resources) or returns a
        non-finite or negative time are skipped. The winner is stored and returned; if every candidate fails,
        ``self.error`` (:class:`AutotuneError` by default) is raised listing the failures.
        """
        if not candidates:
            raise ValueRangeError(f"autotune {op!r} for {key!r}: no candidate configurations given")
        stored = self.get(op, key)
        # A stored winner outside today's candidate list comes from an older kernel generator; retune.
        if stored is not None and stored in candidates:
            return stored
        best: dict[str, Any] | None = None
        best_t = math.inf
        failures: list[str] = []
        last_err: BaseException | None = None
        for cand in candidates:
            try:
                t = float(run(cand))
            except Exception as err:  # any failure just disqualifies the candidate
                last_err = err
                failures.append(f"{cand}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
                log.debug("%s: autotune %s %s: candidate %s failed: %s", self.owner, op, key, cand, err)
                continue
            if not math.isfinite(t) or t < 0:
                failures.append(f"{cand}: run() returned {t!r}")
                continue
            log.debug("%s: autotune %s %s: %s took %.3g s", self.owner, op, key, cand, t)
            if t < best_t:
                best, best_t = cand, t
        if best is None:
            shown = "\n  ".join(failures[:8]) + (f"\n  ... ({len(failures) - 8} more)" if len(failures) > 8 else "")
            raise self.error(f"autotune {op!r} for {key!r} on device {self.device}: all {len(candidates)} "
                             f"candidate configurations failed:\n  {shown}") from last_err
        winner = dict(best)
        self.put(op, key, winner)
        log.debug("%s: autotune %s %s: winner %s (%.3g s)", self.owner, op, key, winner, best_t)
        return winner


__all__ = ["FORMAT", "AutotuneError", "TuneStore", "atomic_write", "cache_dir"]
