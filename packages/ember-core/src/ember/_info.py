"""What ``ember.info()`` and ``ember info`` report: versions, plugins, backends, decorators, ops, load errors.

Everything here is plain data (str, int, bool, None, lists and dicts) so that ``ember info --json`` can dump it.
Collecting never raises for a broken plugin: the failure is part of the report.
"""

from __future__ import annotations

import platform
import sys
from typing import Any


def _jsonable(value: Any) -> Any:
    """Plugin-supplied facts made JSON-safe (unknown objects become their str)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


def _default_device(errors: list[str], fatal: bool) -> str | None:
    from . import device as _device
    from .errors import EmberError

    # an explicit set_default_device wins; otherwise ask Device.default() without caching its answer
    if _device._default is not None:
        return str(_device._default)
    try:
        return str(_device.Device.default())
    except EmberError as exc:
        if not fatal:  # under strict mode the lookup fails with the load error already reported
            errors.append(f"default device: {exc}")
        return None


def collect() -> dict[str, Any]:
    """Gather the report (loads the plugins on first use)."""
    import numpy as np

    from . import __version__
    from .errors import PluginError
    from .plugins.hookspecs import CONTRACT_VERSION
    from .plugins.manager import _strict, registry

    errors: list[str] = []
    fatal: str | None = None
    try:
        registry.ensure_loaded()
    except PluginError as exc:  # EMBER_STRICT_PLUGINS=1: report the fatal error instead of dying
        fatal = str(exc)

    plugins = [
        {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "module": p.module,
            "error": p.error or None,
            "conflicts": list(p.conflicts),
        }
        for p in registry.plugins
    ]
    errors.extend(f"plugin {p.name!r} ({p.module}): {p.error}" for p in registry.plugins if p.error)
    conflicts = [
        {"what": c.what, "name": c.name, "winner": c.winner, "loser": c.loser, "reason": c.reason}
        for c in registry.conflicts
    ]
    errors.extend(f"name conflict: {c}" for c in registry.conflicts)
    if fatal is not None and not errors:  # the strict error is one of the above; only say it when it is not
        errors.append(fatal)

    backends = [
        {
            "name": b.name,
            "kind": b.kind,
            "priority": b.priority,
            "contract": b.contract,
            "devices": b.device_count(),
            "description": b.description,
            "plugin": b.plugin,
        }
        for b in sorted(registry.backends.values(), key=lambda b: b.name)
    ]
    decorators = [
        {"name": d.name, "contract": d.contract, "description": d.description, "plugin": d.plugin}
        for d in sorted(registry.decorators.values(), key=lambda d: d.name)
    ]
    from .extension import registered

    # one list for both ways of registering: register_ops hooks (backends=) and backend_extension (kernels)
    ops = sorted(
        [{"name": o.name, "backends": sorted(o.backends), "description": o.description, "plugin": o.plugin}
         for o in registry.ops.values()]
        + [{"name": o.name, "backends": sorted(o.kernels), "description": o.description, "plugin": o.plugin}
           for o in registered().values()],
        key=lambda o: o["name"],
    )

    raw_info = registry.hook_results("plugin_info", check=False)
    plugin_info = {name: _jsonable(raw_info[name]) for name in sorted(raw_info)}
    for name, facts in plugin_info.items():
        if isinstance(facts, dict) and set(facts) == {"error"}:
            errors.append(f"plugin {name!r}: plugin_info() failed: {facts['error']}")

    default = _default_device(errors, fatal is not None)
    return {
        "ember": __version__,
        "contract": CONTRACT_VERSION,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "numpy": np.__version__,
        "strict": _strict(),
        "plugins": plugins,
        "backends": backends,
        "decorators": decorators,
        "ops": ops,
        "plugin_info": plugin_info,
        "default_device": default,
        # why there is no default device when strict mode made a load error fatal
        "default_device_error": None if fatal is None else "EMBER_STRICT_PLUGINS=1 and a plugin failed to load",
        "conflicts": conflicts,
        "errors": errors,
    }
