"""ember-router: a device decorator that turns every op into an :mod:`ember.ir` record sent through a channel.

``Device.flex().router("local")`` (or ``Device.parse("flex+router(local)")``) resolves to
``RouterBackend(<flex stack>, LocalChannel(...))``: contract calls and extension ops are recorded as
:class:`ember.ir.OpRecord` s on symbolic handles; at a sync point (a read, ``sync()``, the size bound) the
accumulated records are sent as one graph -- registered once in relative form, then replayed by id with bindings.
Channels: ``local`` (another ember device in this process), ``capture`` (local, and every graph kept as an
``ember.capture.CapturedGraph``), or any :class:`Channel` subclass.
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1

from typing import Any  # noqa: E402

__all__ = ["Call", "CaptureChannel", "Channel", "Download", "Executor", "LocalChannel", "Message", "Register",
           "Release", "Replay", "RouterBackend", "Seed", "SliceArg", "Strides", "Sync", "Upload"]

_HOMES = {"CaptureChannel": "channel", "Channel": "channel", "Executor": "channel", "LocalChannel": "channel",
          "RouterBackend": "backend"}


def __getattr__(name: str) -> Any:
    # loaded on first use: plugin discovery imports ember_router.plugin, which must not import ember.capture (core
    # may be in the middle of importing it when discovery runs)
    if name in __all__:
        from importlib import import_module

        return getattr(import_module(f".{_HOMES.get(name, 'protocol')}", __name__), name)
    raise AttributeError(f"module 'ember_router' has no attribute {name!r}")
