"""ember plugin entry point for the autodiff decorator (entry-point group ``ember``, name ``autodiff``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__

CHECKPOINTING = (None, "none", "balanced")


def _factory(inner: Any, checkpointing: str | None = None, **unknown: Any) -> Any:
    from ember.errors import ValueRangeError

    from .backend import AutodiffBackend

    if unknown:
        raise ValueRangeError(f"autodiff: unknown option(s) {sorted(unknown)}; the only option is checkpointing")
    if checkpointing not in CHECKPOINTING:
        raise ValueRangeError(
            f"autodiff: checkpointing must be None or 'balanced', got {checkpointing!r}"
        )
    return AutodiffBackend(inner, balanced=checkpointing == "balanced")


@hookimpl
def register_decorators(register: Callable[..., None]) -> None:
    register(
        "autodiff",
        _factory,
        contract=CONTRACT,
        description=f"reverse-mode differentiation (ember-autodiff {__version__})",
        differentiable=True,
    )


# `ember bench NAME` finds these through the entry-point group ``ember.benchmarks`` (this package's pyproject.toml);
# the scripts live in the source checkout's benchmarks/ folder, not in the wheel.
BENCHMARK = {
    "description": "per-op autodiff overhead, seed-CNN training step and its peak memory (flex+autodiff vs PyTorch)",
    "script": "autodiff.py",
}
