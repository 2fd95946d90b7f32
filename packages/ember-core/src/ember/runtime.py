"""Process-wide runtime settings with PyTorch's names: thread counts and deterministic algorithms.

``ember.set_num_threads(n)`` / ``get_num_threads()`` / ``set_num_interop_threads(n)`` /
``get_num_interop_threads()`` and ``ember.use_deterministic_algorithms(mode, *, warn_only=False)`` /
``are_deterministic_algorithms_enabled()`` / ``is_deterministic_algorithms_warn_only_enabled()``.

Backends take part through the ``register_backend_traits`` hook (:mod:`ember.plugins.hookspecs`): a backend with
a thread pool passes ``set_num_threads`` (ember-flex limits its BLAS and numexpr pools), and a backend with
nondeterministic kernels lists them in ``nondeterministic_ops`` and calls :func:`alert_not_deterministic` when it
runs one. Core never names a backend: it asks the traits the plugins declared. The traits are read once per plugin
set (after ``registry.reset()`` they are read again), never per op.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import PluginError, UnsupportedError, ValueRangeError

log = logging.getLogger("ember.runtime")

_lock = threading.RLock()


@dataclass(frozen=True)
class BackendTraits:
    """What one backend declared through ``register_backend_traits`` (see the hookspec)."""

    backend: str
    plugin: str = ""
    autocast_dtype: Any = None
    autocast_ops: str | None = None
    set_num_threads: Callable[[int], None] | None = None
    nondeterministic_ops: Mapping[str, str] = field(default_factory=dict)


# (plugin manager, plugin count) the cached traits were read from; a reset registry or a plugin registered later
# gives another key, and the traits are read again
_cache_key: tuple[Any, int] | None = None
_traits: dict[str, BackendTraits] = {}


def _strict() -> bool:
    return os.environ.get("EMBER_STRICT_PLUGINS", "") not in ("", "0", "false", "no")


def backend_traits() -> dict[str, BackendTraits]:
    """{backend name: its declared traits} for every loaded plugin that implements ``register_backend_traits``.

    A plugin whose hook raises, or passes a bad declaration, is logged and skipped (a PluginError under
    ``EMBER_STRICT_PLUGINS=1``), as a plugin that fails to load is.
    """
    global _cache_key, _traits
    from .plugins.manager import registry

    registry.ensure_loaded()
    pm = registry._manager()
    key = (pm, len(pm.get_plugins()))
    if key == _cache_key:
        return _traits
    with _lock:
        found: dict[str, BackendTraits] = {}
        for impl in pm.hook.register_backend_traits.get_hookimpls():
            declared: list[BackendTraits] = []

            def register(backend: str, *, autocast_dtype: Any = None, autocast_ops: str | None = None,
                         set_num_threads: Callable[[int], None] | None = None,
                         nondeterministic_ops: Mapping[str, str] | None = None, _plugin: str = impl.plugin_name,
                         _into: list[BackendTraits] = declared) -> None:
                if autocast_ops not in (None, "cpu", "gpu"):
                    raise ValueRangeError(f"register_backend_traits: autocast_ops must be 'cpu', 'gpu' or None, "
                                          f"got {autocast_ops!r} for backend {backend!r}")
                if set_num_threads is not None and not callable(set_num_threads):
                    raise ValueRangeError(f"register_backend_traits: set_num_threads must be callable, got "
                                          f"{type(set_num_threads).__name__} for backend {backend!r}")
                _into.append(BackendTraits(backend, _plugin, autocast_dtype, autocast_ops, set_num_threads,
                                           dict(nondeterministic_ops or {})))

            try:
                impl.function(register=register)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the settings of the others
                err = PluginError(f"ember plugin {impl.plugin_name!r}: register_backend_traits failed: "
                                  f"{type(exc).__name__}: {exc}")
                if _strict():
                    raise err from exc
                log.warning("%s (skipped)", err)
                continue
            for t in declared:
                found.setdefault(t.backend, t)  # the first plugin (name order) keeps a name, as for backends
        _traits, _cache_key = found, key
        if _num_threads is not None:  # plugins (re)loaded after set_num_threads: they get the setting too
            _apply_threads(_num_threads)
        return _traits


# -- threads --------------------------------------------------------------------------------------------------------
_num_threads: int | None = None
_num_interop_threads: int | None = None


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _check_threads(n: Any, op: str) -> int:
    import numbers

    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or int(n) < 1:
        raise ValueRangeError(f"{op}: expected a positive int number of threads, got {n!r}")
    return int(n)


def _apply_threads(n: int) -> None:
    for t in _traits.values():
        if t.set_num_threads is not None:
            try:
                t.set_num_threads(n)
            except Exception as exc:  # noqa: BLE001 - report which backend refused, as a typed error
                raise PluginError(f"set_num_threads: backend {t.backend!r} (plugin {t.plugin!r}) could not use "
                                  f"{n} threads: {type(exc).__name__}: {exc}") from exc


def set_num_threads(n: int) -> None:
    """Set the number of threads backends use for intra-op parallelism (``torch.set_num_threads``).

    Every installed backend that declares a thread pool (``register_backend_traits(set_num_threads=...)``) is
    limited at once, and backends loaded later start limited. Per backend:

    - ember-flex: its own pool for large elementwise ops, casts and reductions (from 2**18 elements on,
      bit-identical to one thread; ``n=1`` runs them serially), the BLAS/OpenMP pools of numpy and scipy (through
      threadpoolctl) and numexpr's pool (fused kernels) get ``n`` threads.
    - ember-opencl: declares no pool: kernels run on the OpenCL device's queue, whose parallelism the driver decides
      (a CPU runtime such as PoCL sizes its own worker pool); the setting is recorded and changes nothing there.
    - a backend without a declaration: the same, recorded only; never a wrong result.
    """
    global _num_threads
    n = _check_threads(n, "set_num_threads")
    with _lock:
        _num_threads = n
        backend_traits()  # loads the plugins; applies n to freshly read traits
        _apply_threads(n)


def get_num_threads() -> int:
    """The intra-op thread count set by :func:`set_num_threads`, else the CPUs this process may run on."""
    return _num_threads if _num_threads is not None else _cpu_count()


def set_num_interop_threads(n: int) -> None:
    """Set the number of inter-op threads (``torch.set_num_interop_threads``): recorded and returned by
    :func:`get_num_interop_threads`. No ember backend runs independent ops in parallel, so nothing else changes;
    as in PyTorch it may be set once."""
    global _num_interop_threads
    n = _check_threads(n, "set_num_interop_threads")
    with _lock:
        if _num_interop_threads is not None:
            raise ValueRangeError("set_num_interop_threads: the number of inter-op threads was already set to "
                                  f"{_num_interop_threads}; it can be set only once (as in PyTorch)")
        _num_interop_threads = n


def get_num_interop_threads() -> int:
    """The inter-op thread count set by :func:`set_num_interop_threads`, else the CPUs this process may run on."""
    return _num_interop_threads if _num_interop_threads is not None else _cpu_count()


# -- deterministic algorithms ---------------------------------------------------------------------------------------
class _Deterministic:
    # process-wide, as torch's flag (read by alert_not_deterministic only, never on the hot path of other ops)
    enabled = False
    warn_only = False


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Make ops whose backend implementation is nondeterministic raise (``warn_only=True``: warn) instead of
    running (``torch.use_deterministic_algorithms``). Backends declare such ops through
    ``register_backend_traits(nondeterministic_ops=...)``; ember-flex has none (numpy is deterministic), ember-opencl
    declares its atomic scatter-reduce. The error is an :class:`~ember.errors.UnsupportedError` naming the op,
    the backend and why."""
    if not isinstance(mode, bool):
        raise ValueRangeError(f"use_deterministic_algorithms: expected a bool mode, got {type(mode).__name__}: "
                              f"{mode!r}")
    if not isinstance(warn_only, bool):
        raise ValueRangeError(f"use_deterministic_algorithms: expected a bool warn_only, got "
                              f"{type(warn_only).__name__}: {warn_only!r}")
    _Deterministic.enabled = mode
    _Deterministic.warn_only = warn_only  # kept even with mode False, as torch reports it


def are_deterministic_algorithms_enabled() -> bool:
    """Whether :func:`use_deterministic_algorithms` is on."""
    return _Deterministic.enabled


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """Whether the last :func:`use_deterministic_algorithms` call passed ``warn_only=True`` (as in PyTorch, also
    when it turned determinism off)."""
    return _Deterministic.warn_only


def alert_not_deterministic(op: str, backend: str, detail: str = "") -> None:
    """Called by a backend right before it runs a nondeterministic kernel (``torch``'s alertNotDeterministic).

    Does nothing unless :func:`use_deterministic_algorithms` is on; then raises UnsupportedError, or with
    ``warn_only=True`` warns (UserWarning), naming the op, the backend and ``detail`` (the dtype, the mode).
    """
    if not _Deterministic.enabled:
        return
    why = ""
    declared = backend_traits().get(backend)
    if declared is not None and op in declared.nondeterministic_ops:
        why = f": {declared.nondeterministic_ops[op]}"
    msg = (f"{op}{f' ({detail})' if detail else ''} on backend {backend!r} does not have a deterministic "
           f"implementation{why}, but ember.use_deterministic_algorithms(True) is set; run it on another device "
           "(e.g. the host: .cpu()), or call use_deterministic_algorithms(True, warn_only=True) to be warned instead")
    if _Deterministic.warn_only:
        warnings.warn(msg, UserWarning, stacklevel=3)
        return
    raise UnsupportedError(msg)


def nondeterministic_ops() -> dict[str, dict[str, str]]:
    """{backend: {op: why}} as declared by the installed backends (what use_deterministic_algorithms guards)."""
    return {name: dict(t.nondeterministic_ops) for name, t in backend_traits().items() if t.nondeterministic_ops}


__all__ = [
    "set_num_threads", "get_num_threads", "set_num_interop_threads", "get_num_interop_threads",
    "use_deterministic_algorithms", "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled", "alert_not_deterministic", "backend_traits",
    "nondeterministic_ops", "BackendTraits",
]
