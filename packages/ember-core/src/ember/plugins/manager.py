"""Lazy, tolerant plugin discovery.

Plugins are found through the entry-point group ``ember`` the first time anything asks for them (a device
resolution, ``ember.info()``), never at ``import ember``. A plugin that fails to import or to register is logged
and skipped, unless ``EMBER_STRICT_PLUGINS=1`` makes that fatal. ``EMBER_DISABLE_PLUGINS=a,b`` skips plugins by
entry-point name. The per-op path never touches this module.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ..errors import PluginError
from .hookspecs import CONTRACT_VERSION

log = logging.getLogger("ember.plugins")

ENTRY_POINT_GROUP = "ember"


@dataclass(frozen=True)
class BackendSpec:
    name: str
    factory: Callable[..., Any]
    contract: int
    kind: str = "cpu"
    priority: int = 0
    is_available: Callable[[], int] | None = None
    description: str = ""
    plugin: str = ""
    #: the ranking kind of device i when it differs between devices (OpenCL: a GPU, or a CPU runtime such as
    #: PoCL that must not be preferred over flex); None means every device is of ``kind``
    device_kind: Callable[[int], str] | None = None
    #: what to install when no device is found (shown by Device.<kind>(i) and ember info)
    install_hint: str = ""

    def kind_of(self, index: int) -> str:
        if self.device_kind is None:
            return self.kind
        try:
            return str(self.device_kind(index))
        except Exception as exc:  # a driver failing to describe a device: rank it lowest, never crash default()
            log.debug("backend %s device_kind(%d) failed: %s", self.name, index, exc)
            return "emulated"

    def device_count(self) -> int:
        if self.is_available is None:
            return 1
        try:
            return int(self.is_available())
        except Exception as exc:  # missing driver etc.: the device is simply absent
            log.debug("backend %s availability check failed: %s", self.name, exc)
            return 0


@dataclass(frozen=True)
class DecoratorSpec:
    name: str
    factory: Callable[..., Any]
    contract: int
    description: str = ""
    plugin: str = ""
    #: applied to every device by default, innermost (directly over the backend); ``device.<name>(False)``
    #: opts a device out. The factory may return the backend unchanged when it does not apply (fusion on a
    #: backend without code generation).
    automatic: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    default: Callable[..., Any]
    backends: dict[str, Callable[..., Any]] = field(default_factory=dict)
    description: str = ""
    plugin: str = ""
    #: the default composition may be recorded and fused by the fusion decorator; otherwise a backend's own
    #: implementation runs as a fusion boundary
    fusable: bool = False


@dataclass
class PluginRecord:
    name: str
    module: str
    version: str = ""
    distribution: str = ""
    error: str = ""


def _strict() -> bool:
    return os.environ.get("EMBER_STRICT_PLUGINS", "") not in ("", "0", "false", "no")


def _disabled() -> set[str]:
    raw = os.environ.get("EMBER_DISABLE_PLUGINS", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


class PluginRegistry:
    """Everything plugins registered: backends, decorators, extension ops, and what failed to load."""

    def __init__(self) -> None:
        self.backends: dict[str, BackendSpec] = {}
        self.decorators: dict[str, DecoratorSpec] = {}
        self.ops: dict[str, OpSpec] = {}
        self.plugins: list[PluginRecord] = []
        self._loaded = False
        self._lock = threading.RLock()
        self._pm: Any = None

    # -- discovery -------------------------------------------------------------------------------------------
    def ensure_loaded(self) -> PluginRegistry:
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._load_entry_points()
                    self._loaded = True
        return self

    def _manager(self) -> Any:
        if self._pm is None:
            import pluggy

            from . import hookspecs

            self._pm = pluggy.PluginManager("ember")
            self._pm.add_hookspecs(hookspecs)
        return self._pm

    def _load_entry_points(self) -> None:
        disabled = _disabled()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in disabled:
                log.info("ember plugin %s disabled by EMBER_DISABLE_PLUGINS", ep.name)
                continue
            dist = ep.dist
            record = PluginRecord(
                name=ep.name,
                module=ep.value,
                version=dist.version if dist else "",
                distribution=dist.metadata["Name"] if dist else "",
            )
            try:
                module = ep.load()
            except Exception as exc:
                self._fail(record, f"import failed: {type(exc).__name__}: {exc}", exc)
                continue
            self.register_plugin(module, record=record)

    def register_plugin(self, plugin: object, name: str | None = None, *, record: PluginRecord | None = None) -> None:
        """Register a plugin object or module directly (tests, or applications without entry points)."""
        if record is None:
            name = name or getattr(plugin, "__name__", type(plugin).__name__)
            record = PluginRecord(name=name, module=getattr(plugin, "__name__", repr(plugin)))
        with self._lock:
            pm = self._manager()
            try:
                pm.register(plugin, name=record.name)
            except Exception as exc:
                self._fail(record, f"registration failed: {exc}", exc)
                return
            self.plugins.append(record)
            try:
                self._call_hooks(plugin, record)
            except Exception as exc:
                pm.unregister(plugin)
                self.plugins.remove(record)
                self._fail(record, f"register hooks failed: {type(exc).__name__}: {exc}", exc)

    def _call_hooks(self, plugin: object, record: PluginRecord) -> None:
        pm = self._manager()
        new_backends: list[BackendSpec] = []
        new_decorators: list[DecoratorSpec] = []
        new_ops: list[OpSpec] = []

        def reg_backend(name: str, factory: Callable[..., Any], *, contract: int, **kw: Any) -> None:
            new_backends.append(BackendSpec(name, factory, contract, plugin=record.name, **kw))

        def reg_decorator(name: str, factory: Callable[..., Any], *, contract: int, **kw: Any) -> None:
            new_decorators.append(DecoratorSpec(name, factory, contract, plugin=record.name, **kw))

        def reg_op(name: str, default: Callable[..., Any], *, backends: dict | None = None, **kw: Any) -> None:
            new_ops.append(OpSpec(name, default, dict(backends or {}), plugin=record.name, **kw))

        others = [p for p in pm.get_plugins() if p is not plugin]
        for hook, callback in (
            ("register_backends", reg_backend),
            ("register_decorators", reg_decorator),
            ("register_ops", reg_op),
        ):
            pm.subset_hook_caller(hook, remove_plugins=others)(register=callback)
        for spec in (*new_backends, *new_decorators):
            if spec.contract != CONTRACT_VERSION:
                msg = (
                    f"plugin {record.name!r} implements backend contract {spec.contract} for {spec.name!r}, "
                    f"but this ember-core implements contract {CONTRACT_VERSION}; upgrade the plugin or ember-core"
                )
                raise PluginError(msg)
        for b in new_backends:
            self.backends[b.name] = b
        for d in new_decorators:
            self.decorators[d.name] = d
        for o in new_ops:
            self.ops[o.name] = o

    def _fail(self, record: PluginRecord, message: str, exc: BaseException) -> None:
        record.error = message
        self.plugins.append(record)
        if _strict():
            raise PluginError(f"ember plugin {record.name!r} ({record.module}): {message}") from exc
        log.warning("ember plugin %r skipped: %s", record.name, message)

    # -- queries ---------------------------------------------------------------------------------------------
    def backend(self, name: str) -> BackendSpec:
        self.ensure_loaded()
        spec = self.backends.get(name)
        if spec is None:
            failed = [p for p in self.plugins if p.name == name and p.error]
            why = f" (the plugin is installed but failed to load: {failed[0].error})" if failed else ""
            raise PluginError(
                f"no backend named {name!r} is installed{why}; install its plugin with "
                f"pip install 'ember[{name}]' (installed backends: {sorted(self.backends) or 'none'})"
            )
        return spec

    def decorator(self, name: str) -> DecoratorSpec | None:
        self.ensure_loaded()
        return self.decorators.get(name)

    def automatic_decorators(self) -> list[DecoratorSpec]:
        """Decorators applied to every device unless it opts out, in name order (see ``register_decorators``)."""
        self.ensure_loaded()
        return sorted((d for d in self.decorators.values() if d.automatic), key=lambda d: d.name)

    def hook_results(self, name: str) -> dict[str, Any]:
        """Call the argument-less hook ``name`` (``plugin_info``) on each loaded plugin: {plugin: result}.

        A plugin whose hook raises gets ``{"error": "..."}``: ``ember info`` must work even when a plugin is broken.
        """
        self.ensure_loaded()
        results: dict[str, Any] = {}
        with self._lock:
            for impl in getattr(self._manager().hook, name).get_hookimpls():
                try:
                    results[impl.plugin_name] = impl.function()
                except Exception as exc:
                    results[impl.plugin_name] = {"error": f"{type(exc).__name__}: {exc}"}
        return results

    def reset(self) -> None:
        """Forget everything (tests). The next query rediscovers entry points."""
        with self._lock:
            self.__init__()  # type: ignore[misc]


registry = PluginRegistry()
