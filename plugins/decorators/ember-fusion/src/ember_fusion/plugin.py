"""ember plugin entry point for the fusion decorator (entry-point group ``ember``, name ``fusion``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__


def enabled_by_environment() -> bool:
    """False when ``EMBER_FUSION`` is set to 0/false/no/off (fusion off for every device)."""
    return os.environ.get("EMBER_FUSION", "1").strip().lower() not in ("0", "false", "no", "off")


def supports_fusion(backend: Any) -> bool:
    """A backend supports fusion when it overrides ``Backend.fusion_compile`` (its code-generation hook)."""
    from ember.backend import Backend

    return getattr(type(backend), "fusion_compile", Backend.fusion_compile) is not Backend.fusion_compile


def fuses_unnamed(backend: Any) -> bool:
    """Whether fusion wraps ``backend`` on a device that does not name it: it supports fusion and does not
    decline it (``Backend.fuse_by_default``; flex declines, its fused kernels measured no faster than its ops)."""
    return supports_fusion(backend) and bool(getattr(backend, "fuse_by_default", True))


def _count_option(name: str, value: Any, default: int, minimum: int) -> int:
    """A whole-number option given as an int (or as digits, from a device string built by hand), checked."""
    from ember.errors import ValueRangeError

    bound = default if value is None else value
    if type(bound) is str and bound.strip().isdigit():  # Device("flex", decorators=...) built by hand from text
        bound = int(bound)
    if type(bound) is not int or bound < minimum:
        kind = "a positive int" if minimum > 0 else "an int >= 0"
        raise ValueRangeError(f"fusion: {name} must be {kind}, got {value!r}")
    return bound


def _factory(inner: Any, max_pending: Any = None, eager_below: Any = None, **unknown: Any) -> Any:
    from ember.errors import ValueRangeError

    from .backend import DEFAULT_EAGER_BELOW, DEFAULT_MAX_PENDING, FusionBackend

    if unknown:
        raise ValueRangeError(f"fusion: unknown option(s) {sorted(unknown)}; the options are max_pending and "
                              "eager_below")
    if not enabled_by_environment() or not supports_fusion(inner):
        return inner
    return FusionBackend(inner, max_pending=_count_option("max_pending", max_pending, DEFAULT_MAX_PENDING, 1),
                         eager_below=_count_option("eager_below", eager_below, DEFAULT_EAGER_BELOW, 0))


@hookimpl
def register_decorators(register: Callable[..., None]) -> None:
    register(
        "fusion",
        _factory,
        contract=CONTRACT,
        automatic=True,
        enabled=enabled_by_environment,  # EMBER_FUSION=0: devices print as opted out (flex+fusion(enabled=False))
        applies_to=fuses_unnamed,  # Device.flex() is unfused; Device.flex().fusion() fuses
        description=f"lazy recording and fused kernels (ember-fusion {__version__})",
    )


# `ember bench NAME` finds these through the entry-point group ``ember.benchmarks`` (this package's pyproject.toml);
# the scripts live in the source checkout's benchmarks/ folder, not in the wheel.
BENCHMARK = {
    "description": "fused vs unfused devices: GELU chain, seed-CNN/transformer training steps, recording overhead",
    "script": "fusion.py",
}
