"""The plugin module named by the entry point: ember calls these hooks once, lazily, never per op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__


def _factory(index: int = 0, **options: Any) -> Any:
    # import the backend only when a toy device is actually used: discovery must stay cheap
    from .backend import ToyBackend

    if options:
        from ember.errors import DeviceError

        raise DeviceError(f"toy takes no options, got {sorted(options)}")
    return ToyBackend(index)


@hookimpl
def register_backends(register: Callable[..., None]) -> None:
    register(
        "toy",
        _factory,
        contract=CONTRACT,
        kind="emulated",
        priority=0,
        # not host=True: from_numpy copies into a ToyArray box, so the toy cannot adopt host arrays the way the
        # host device must (ember.from_numpy shares memory); it stays an ordinary device that .cpu() moves from
        host=False,
        description=f"example third-party backend: required primitives only (ember-example-backend {__version__})",
    )


@hookimpl
def plugin_info() -> dict[str, Any]:
    return {"example": True, "handles": "ToyArray"}
