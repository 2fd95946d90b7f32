"""ember plugin entry point for ember-distributed (entry-point group ``ember``, name ``distributed``): publishes
``ember.distributed`` (imported on first use; importing it does not start MPI, :func:`init` does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import __version__


@hookimpl
def register_namespaces(register: Callable[..., None]) -> None:
    """Publish :mod:`ember_distributed.api` as ``ember.distributed``."""
    register("distributed", "ember_distributed.api")


@hookimpl
def plugin_info() -> dict[str, Any]:
    """What ``ember info`` shows: the version and the engines importable here."""
    engines = []
    try:
        import mpi4py

        engines.append(f"mpi (mpi4py {mpi4py.__version__})")
    except ImportError:
        pass
    try:
        import cupy.cuda.nccl  # noqa: F401

        engines.append("nccl (cupy)")
    except Exception:  # CuPy absent or without NCCL: only MPI
        pass
    return {"ember-distributed": __version__, "engines": engines}
