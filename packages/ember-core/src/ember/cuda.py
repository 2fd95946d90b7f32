"""``ember.cuda``: the ``torch.cuda`` queries that ported scripts ask before choosing a device.

ember has no CUDA code in core: a CUDA device is whatever installed backend plugin registers the backend name
``"cuda"``, and these functions ask the plugin registry about it. With none
installed, :func:`is_available` is False and :func:`device_count` is 0, so the usual
``ember.device("cuda" if ember.cuda.is_available() else "cpu")`` picks the host; functions that need a device
(``synchronize``, ``get_device_name``) raise the :class:`~ember.errors.DeviceError` that says what to install.

Seeding a CUDA device is seeding its stream: :func:`manual_seed_all` reseeds every CUDA device
(``ember.manual_seed`` already does, with every other device).
"""

from __future__ import annotations

from typing import Any

from .device import Device, as_device
from .errors import DeviceError

__all__ = ["current_device", "device_count", "get_device_name", "is_available", "manual_seed", "manual_seed_all",
           "synchronize"]

#: the device kind torch calls CUDA (ROCm builds of torch use the same name)
KIND = "cuda"


def _spec() -> Any:
    from .plugins.manager import registry

    return registry.ensure_loaded().backends.get(KIND)


def device_count() -> int:
    """The number of CUDA devices present (0 when no backend plugin for them is installed or none is found)."""
    spec = _spec()
    return 0 if spec is None else spec.device_count()


def is_available() -> bool:
    """Whether at least one CUDA device can be used."""
    return device_count() > 0


def current_device() -> int:
    """The index ``ember.device("cuda")`` means: 0 (ember devices are explicit; there is no per-thread current
    device to switch)."""
    _check_index(0, "current_device")
    return 0


def _device(device: Any, op: str) -> Device:
    """``device`` (None, an index, ``"cuda:i"`` or a Device) as a CUDA Device, checked to exist."""
    if device is None or isinstance(device, int) and not isinstance(device, bool):
        index = 0 if device is None else device
        _check_index(index, op)
        return Device(KIND, index)
    dev = as_device(device)
    if dev.base.kind != KIND:
        raise DeviceError(f"ember.cuda.{op}: expected a CUDA device, got {dev}")
    _check_index(dev.base.index, op)
    return dev


def _check_index(index: int, op: str) -> None:
    n = device_count()
    if n == 0:
        from .plugins.manager import install_hint

        raise DeviceError(f"ember.cuda.{op}: no CUDA device is available; {install_hint(KIND)} (check "
                          "ember.cuda.is_available() first, or use ember.device('cpu'))")
    if not 0 <= index < n:
        raise DeviceError(f"ember.cuda.{op}: invalid device index {index}: {n} CUDA device(s) present "
                          f"(0..{n - 1})")


def get_device_name(device: Any = None) -> str:
    """A human-readable name of the CUDA device (what ``ember info`` shows for it)."""
    dev = _device(device, "get_device_name")
    return str(dev)


def synchronize(device: Any = None) -> None:
    """Block until all work queued on the CUDA device is done."""
    _device(device, "synchronize").sync()


def manual_seed(seed: int) -> None:
    """Seed the current CUDA device's random stream (a no-op without CUDA devices, as in PyTorch)."""
    if is_available():
        Device(KIND, 0).seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every CUDA device's random stream (a no-op without CUDA devices, as in PyTorch)."""
    for i in range(device_count()):
        Device(KIND, i).seed(seed)
