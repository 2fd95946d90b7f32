"""Namespaces that plugins publish on ``ember`` (the ``register_namespaces`` hook).

``ember.distributed`` or ``ember.fft`` is a plugin's module; core only looks the name up, on first use, among
what the loaded plugins registered. A core namespace open to plugins (``ember.linalg``) keeps core's names and
asks the plugins for the rest. A name no installed plugin provides raises :class:`MissingPluginError` naming the
extra that installs one, read from the installed ember distribution's metadata, so core names no plugin.
"""

from __future__ import annotations

import keyword
import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

from ..errors import MissingPluginError, PluginError

#: core modules whose missing names plugins may provide (core keeps matmul and the norms in ``ember.linalg``)
OPEN_CORE_NAMESPACES = frozenset({"linalg"})

#: install hints only (core looks nothing up by these names): namespaces whose extra of ember-core's own
#: pyproject.toml has another name; ``ember.fft`` and torch's window factories ship in the ``signal`` extra
INSTALL_HINT_EXTRAS = {name: "signal" for name in ("fft", "stft", "istft", "hann_window", "hamming_window",
                                                   "blackman_window", "bartlett_window", "kaiser_window")}


def check_namespace(name: str, module: str) -> None:
    """Refuse a ``register_namespaces`` call that could never be reached or would hide one of core's names."""
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or keyword.iskeyword(name):
        raise PluginError(f"register_namespaces: the name must be a public identifier, got {name!r}")
    path, _, attr = module.partition(":") if isinstance(module, str) else ("", "", "")
    if not path or not all(p.isidentifier() for p in path.split(".")) or (attr and not attr.isidentifier()):
        raise PluginError(f"register_namespaces({name!r}): module must be an import path such as "
                          f"'mypkg.api' (or 'mypkg.api:function'), got {module!r}")
    import ember

    if name not in OPEN_CORE_NAMESPACES and (name in vars(ember) or name in ember.LAZY_SUBMODULES):
        raise PluginError(f"register_namespaces({name!r}): ember.{name} is one of core's own names")


def _target(name: str) -> Any:
    """The object a plugin registered as ``ember.<name>``, imported now; None when no loaded plugin did."""
    from .manager import registry

    spec = registry.namespaces.get(name)
    if spec is None:
        return None
    path, _, attr = spec.module.partition(":")
    try:
        module = import_module(path)
        return getattr(module, attr) if attr else module
    except (ImportError, AttributeError) as exc:  # a broken plugin must say so, not look like a missing name
        raise PluginError(f"the plugin {spec.plugin!r} publishes ember.{name} as {spec.module!r}, which cannot "
                          f"be imported: {type(exc).__name__}: {exc}") from exc


def install_extra_hint(namespace: str) -> str | None:
    """The pip line for the extra of the installed ember distribution that provides ``namespace`` (or None)."""
    from .manager import _extra_providing

    extra = INSTALL_HINT_EXTRAS.get(namespace, namespace)
    for dist in ("ember", "ember-core"):
        if _extra_providing(dist, extra):
            return f"it comes from the ember-{extra} plugin: pip install '{dist}[{extra}]'"
    return None


def resolve_top_level(name: str) -> Any:
    """``ember.<name>`` for a name core does not define: what a plugin published (``ember.__getattr__``)."""
    import ember

    from .manager import registry

    if name.startswith("__"):  # copy, pickle and inspect probe dunders: never load plugins for them
        raise AttributeError(f"module 'ember' has no attribute {name!r}")
    registry.ensure_loaded()
    if name in vars(ember):  # published while the plugins loaded (backend_extension("ns.op") namespaces)
        return vars(ember)[name]
    target = _target(name)
    if target is not None:
        return target
    hint = install_extra_hint(name)
    if hint is not None:
        raise MissingPluginError(f"ember.{name} is provided by a plugin that is not installed; {hint}")
    raise AttributeError(f"module 'ember' has no attribute {name!r}")


def open_namespace(namespace: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the core module ``ember.<namespace>``: core's names, then the plugins'."""
    if namespace not in OPEN_CORE_NAMESPACES:
        raise PluginError(f"ember.{namespace} is not a core namespace open to plugins")
    qualname = f"ember.{namespace}"

    def __getattr__(attr: str) -> Any:
        from .manager import registry

        if attr.startswith("__"):
            raise AttributeError(f"module {qualname!r} has no attribute {attr!r}")
        registry.ensure_loaded()
        own = vars(sys.modules[qualname])
        if attr in own:  # published while the plugins loaded (backend_extension("linalg.op"))
            return own[attr]
        target = _target(namespace)
        if target is not None:
            if hasattr(target, attr):
                return getattr(target, attr)
            raise AttributeError(f"module {qualname!r} has no attribute {attr!r} (neither core nor the plugin "
                                 f"{registry.namespaces[namespace].plugin!r} provides it)")
        hint = install_extra_hint(namespace)
        if hint is not None:
            raise MissingPluginError(f"{qualname}.{attr} is not part of ember-core; {hint}")
        raise AttributeError(f"module {qualname!r} has no attribute {attr!r}")

    def __dir__() -> list[str]:
        from .manager import registry

        names = set(vars(sys.modules[qualname]))
        try:
            registry.ensure_loaded()
            target = _target(namespace)
        except PluginError:  # dir() in a REPL must not raise for a broken plugin
            target = None
        if target is not None:
            names.update(n for n in dir(target) if not n.startswith("_"))
        return sorted(names)

    return __getattr__, __dir__
