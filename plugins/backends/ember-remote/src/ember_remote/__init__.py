"""ember-remote: ``ember serve`` runs an ember device behind TLS 1.3; ``Device.remote(url)`` is a device whose ops
are recorded as :mod:`ember.ir` records, batched until a read or sync, and run on the server (graph replay: a
repeated sequence of ops is registered once and then replayed by id with new bindings).
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1

from typing import Any  # noqa: E402

__all__ = ["ProtocolError", "RemoteBackend", "RemoteError", "Server"]

_HOMES = {"ProtocolError": "protocol", "RemoteError": "protocol", "RemoteBackend": "client", "Server": "server"}


def __getattr__(name: str) -> Any:
    # loaded on first use: plugin discovery imports ember_remote.plugin, which must not import ember.capture (core
    # may be in the middle of importing it when discovery runs)
    home = _HOMES.get(name)
    if home is not None:
        from importlib import import_module

        return getattr(import_module(f".{home}", __name__), name)
    raise AttributeError(f"module 'ember_remote' has no attribute {name!r}")
