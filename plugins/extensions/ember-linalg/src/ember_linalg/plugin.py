"""ember plugin entry point for ember-linalg (entry-point group ``ember``, name ``linalg``).

It publishes :mod:`ember_linalg.api` as the ``linalg`` namespace: names core's ``ember.linalg`` lacks
(``cholesky``, ``solve``, ``svd``, ...) are looked up there on first use. The ops register with
``ember.backend_extension`` when that module is imported (lazily, on the first such lookup).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.plugins import hookimpl

from . import __version__


@hookimpl
def register_namespaces(register: Any) -> None:
    """``ember.linalg.<name>`` for the names of :mod:`ember_linalg.api` (core's matmul and vector_norm win)."""
    register("linalg", "ember_linalg.api")


@hookimpl
def plugin_info() -> dict[str, Any]:
    """What ``ember info`` shows for ember-linalg: its version and where its kernels run."""
    return {"ember-linalg": __version__, "kernels": "LAPACK (numpy/scipy) on flex; host fallback on other backends"}


# `ember bench linalg` (entry-point group ``ember.benchmarks``): the script ships in this package, so an absolute
# path is registered and the benchmark runs from an installed wheel too
LINALG_BENCHMARK = {
    "description": "ember.linalg (ember-linalg, LAPACK on flex) vs torch.linalg: solve, inv, cholesky, eigh, svd, qr, "
                   "det on a few shapes, forward and forward+backward",
    "script": str(Path(__file__).with_name("bench.py")),
}
