"""ember plugin entry point for the remote backend (entry-point group ``ember``, name ``remote``).

``Device.remote("ember://host:7433/flex", token=..., fingerprint=..., insecure=False, timeout=300.0,
cafile=None, max_pending=1024, flush_bytes=2**26, compress=False)``: the token and fingerprint may also come from
``EMBER_REMOTE_TOKEN`` and ``EMBER_REMOTE_FINGERPRINT``; the plain device string ``"remote"`` takes the address from
``EMBER_REMOTE_URL`` (and plaintext from ``EMBER_REMOTE_INSECURE=1``, loopback only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__

_OPTIONS = ("address", "token", "fingerprint", "insecure", "timeout", "cafile", "max_pending", "flush_bytes",
            "compress")


def _factory(index: int = 0, **options: Any) -> Any:
    from ember.errors import DeviceError

    from .client import RemoteBackend

    if index != 0:
        raise DeviceError(f"remote: a remote device has index 0 (the server's device is in the address), got {index}")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise DeviceError(f"remote: unknown option(s) {unknown}; the options are {list(_OPTIONS)}")
    if "address" not in options:
        # the device string "remote" (EMBER_DEVICE=remote, the kit's --ember-device=remote) takes it from the env
        import os

        if not os.environ.get("EMBER_REMOTE_URL"):
            raise DeviceError("remote: use Device.remote('ember://host:7433/flex', token=..., fingerprint=...), or "
                              "set EMBER_REMOTE_URL (with EMBER_REMOTE_TOKEN and EMBER_REMOTE_FINGERPRINT)")
        options["address"] = os.environ["EMBER_REMOTE_URL"]
        options.setdefault("insecure", os.environ.get("EMBER_REMOTE_INSECURE", "") in ("1", "true", "yes"))
    return RemoteBackend(**options)


@hookimpl
def register_backends(register: Callable[..., None]) -> None:
    register(
        "remote",
        _factory,
        contract=CONTRACT,
        # not a ranking kind: Device.default() never picks a remote device
        kind="remote",
        priority=-100,
        # Device.remote("ember://host:7433/flex", token=...): the first positional argument is the address
        positional=("address",),
        description=f"a device on an `ember serve` server, over TLS 1.3 (ember-remote {__version__})",
    )
