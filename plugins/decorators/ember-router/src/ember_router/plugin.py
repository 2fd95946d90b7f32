"""ember plugin entry point for the router decorator (entry-point group ``ember``, name ``router``).

``device.router(channel, device=None, max_pending=1024, flush_bytes=2**26)``: ``channel`` is ``"local"`` (run on
the inner stack, or on ``device`` when given), ``"capture"`` (local, keeping every graph), or a
:class:`ember_router.Channel` instance (a third-party channel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__

CHANNELS = ("local", "capture")


def _count(name: str, value: Any, default: int) -> int:
    from ember.errors import ValueRangeError

    v = default if value is None else value
    if type(v) is str and v.strip().isdigit():  # from a device string
        v = int(v)
    if type(v) is not int or v < 1:
        raise ValueRangeError(f"router: {name} must be a positive int, got {value!r}")
    return v


def _factory(inner: Any, channel: Any = "local", device: Any = None, max_pending: Any = None,
             flush_bytes: Any = None, **unknown: Any) -> Any:
    from ember import Device
    from ember.errors import ValueRangeError

    from .backend import DEFAULT_FLUSH_BYTES, DEFAULT_MAX_PENDING, RouterBackend
    from .channel import CaptureChannel, Channel, LocalChannel

    if unknown:
        raise ValueRangeError(f"router: unknown option(s) {sorted(unknown)}; the options are channel, device, "
                              "max_pending and flush_bytes")
    if isinstance(channel, Channel):
        if device is not None:
            raise ValueRangeError("router: device= applies to the local and capture channels only")
        ch = channel
    elif channel in CHANNELS:
        target = Device.parse(device) if isinstance(device, str) else device
        if target is not None and not isinstance(target, Device):
            raise ValueRangeError(f"router: device must be a Device or a device string, got {device!r}")
        stack = inner if target is None else target.stack
        ch = (LocalChannel if channel == "local" else CaptureChannel)(stack, target)
    else:
        raise ValueRangeError(f"router: channel must be one of {list(CHANNELS)} or an ember_router.Channel, got "
                              f"{channel!r}")
    return RouterBackend(inner, ch, max_pending=_count("max_pending", max_pending, DEFAULT_MAX_PENDING),
                         flush_bytes=_count("flush_bytes", flush_bytes, DEFAULT_FLUSH_BYTES))


@hookimpl
def register_decorators(register: Callable[..., None]) -> None:
    register(
        "router",
        _factory,
        contract=CONTRACT,
        description=f"ops as ember.ir records through a channel, graph replay (ember-router {__version__})",
        positional=("channel",),
    )
