"""``torch.utils.data`` for ports: ``from ember.utils.data import DataLoader, Dataset, TensorDataset``.

Every public name of ``ember_train.data`` (the ``ember-train`` distribution, which ``pip install ember`` includes),
resolved on first use so that importing this module costs nothing. Without ``ember-train`` installed a name
raises :class:`ember.errors.PluginError` with the install command.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..errors import PluginError

_SOURCE = "ember_train.data"
_DISTRIBUTION = "ember-train"


def _source() -> Any:
    try:
        return import_module(_SOURCE)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _SOURCE.startswith(exc.name):
            raise  # a missing dependency inside the installed package is its own error
        raise PluginError(
            f"ember.utils.data needs the {_DISTRIBUTION} package (datasets and the DataLoader), which is not "
            f"installed: pip install {_DISTRIBUTION} (or pip install ember, which includes it)"
        ) from None


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    module = _source()
    try:
        value = getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'ember.utils.data' has no attribute {name!r} (it re-exports "
                             f"{_SOURCE}: {', '.join(sorted(_public(module)))})") from None
    globals()[name] = value  # later lookups are plain module attributes
    return value


def _public(module: Any) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__]
    return list(names)


def __dir__() -> list[str]:
    try:
        return sorted(set(globals()) | set(_public(_source())))
    except PluginError:
        return sorted(globals())
