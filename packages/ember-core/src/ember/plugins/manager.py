"""Lazy, tolerant plugin discovery.

Plugins are found through the entry-point group ``ember`` the first time anything asks for them (a device
resolution, ``ember.info()``), never at ``import ember``. A plugin that fails to import or to register is logged
and skipped, unless ``EMBER_STRICT_PLUGINS=1`` makes that fatal. ``EMBER_DISABLE_PLUGINS=a,b`` skips plugins by
entry-point name. The per-op path never touches this module.

Plugin code can raise anything, ``SystemExit`` included; every ``BaseException`` it raises is caught and reported
as that plugin's failure, except ``KeyboardInterrupt`` and ``GeneratorExit``, which are the user's or the
interpreter's and propagate. Two plugins registering the same backend, decorator or op name is a *conflict*: the
plugin whose entry-point name is that name owns it (a plugin with entry point ``mine`` owns the backend
``mine``); otherwise the first registration wins (entry points load in name order, so "first" does not depend on
the environment). The losing registration is dropped with a warning, shown by ``ember info``, and is fatal under
``EMBER_STRICT_PLUGINS=1``.
"""

from __future__ import annotations

import builtins
import keyword
import logging
import os
import re
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
    #: the backend's memory is the host's: ``from_numpy`` adopts a C-contiguous array without copying and
    #: ``to_numpy`` returns the handle's own memory. Core's host device (``Device.host()``: ``.cpu()``,
    #: ``ember.from_numpy``, ``records.load_into``, the device string ``"cpu"``) is the highest-priority such backend.
    host: bool = False
    #: option names that positional arguments of ``Device.<kind>(...)`` fill instead of the index, in order
    #: (a remote backend: ``Device.remote("ember://host:7433/flex")`` is ``Device.remote(address=...)``)
    positional: tuple[str, ...] = ()

    def kind_of(self, index: int) -> str:
        if self.device_kind is None:
            return self.kind
        try:
            return str(self.device_kind(index))
        except BaseException as exc:  # a driver failing to describe a device: rank it lowest, never crash default()
            if _propagates(exc):
                raise
            log.debug("backend %s device_kind(%d) failed: %s", self.name, index, exc)
            return "emulated"

    def device_count(self) -> int:
        if self.is_available is None:
            return 1
        try:
            return int(self.is_available())
        except BaseException as exc:  # missing driver etc.: the device is simply absent
            if _propagates(exc):
                raise
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
    #: for an automatic decorator: whether it is on by default right now (an environment switch such as
    #: ``EMBER_FUSION=0`` turns it off for every device); None means always on
    enabled: Callable[[], bool] | None = None
    #: the decorated stack records gradients (implements ember.decorator.Differentiable); a capability core and
    #: the conformance kit look for instead of a name
    differentiable: bool = False
    #: option names that positional arguments fill, in order (``device.router("local")`` is
    #: ``router(channel="local")``, and the device string ``flex+router(local)`` too)
    positional: tuple[str, ...] = ()
    #: for an automatic decorator: whether it applies to a given backend on a device that does not name it (a
    #: backend may decline: flex declines fusion, whose fused kernels do not beat its eager ops); None means every
    #: backend. A device that names the decorator (``dev.fusion()``) gets it whatever this says.
    applies_to: Callable[[Any], bool] | None = None

    def applies_unnamed(self, backend: Any) -> bool:
        """Whether this automatic decorator wraps ``backend`` on a device that does not name it (never raises)."""
        if self.applies_to is None:
            return True
        try:
            return bool(self.applies_to(backend))
        except BaseException as exc:  # a broken predicate: apply it, as the documented default
            if _propagates(exc):
                raise
            log.debug("decorator %s applies_to() failed: %s", self.name, exc)
            return True

    def on_by_default(self) -> bool:
        """Whether this automatic decorator applies to devices that do not mention it (never raises)."""
        if self.enabled is None:
            return True
        try:
            return bool(self.enabled())
        except BaseException as exc:  # a broken switch: keep the documented default (on)
            if _propagates(exc):
                raise
            log.debug("decorator %s enabled() failed: %s", self.name, exc)
            return True


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


@dataclass(frozen=True)
class NamespaceSpec:
    """A module a plugin publishes as ``ember.<name>`` (the ``register_namespaces`` hook)."""

    name: str
    module: str
    plugin: str = ""


@dataclass
class PluginRecord:
    name: str
    module: str
    version: str = ""
    distribution: str = ""
    error: str = ""
    #: names this plugin registered but lost to another plugin (see :class:`Conflict`)
    conflicts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Conflict:
    """Two plugins registered the same name; ``winner`` keeps it."""

    what: str  # "backend", "decorator", "op" or "namespace"
    name: str
    winner: str
    loser: str
    reason: str

    def __str__(self) -> str:
        return (f"{self.what} {self.name!r} is registered by plugins {self.winner!r} and {self.loser!r}; "
                f"{self.winner!r} keeps it ({self.reason}); remove or disable one of them with "
                f"EMBER_DISABLE_PLUGINS")


# what a plugin may raise that is still the user's or the interpreter's business, never the plugin's failure
_PROPAGATE = (KeyboardInterrupt, GeneratorExit)
_BACKEND_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def _propagates(exc: BaseException) -> bool:
    group = getattr(builtins, "BaseExceptionGroup", None)
    if group is not None and isinstance(exc, group):
        return exc.subgroup(_PROPAGATE) is not None
    return isinstance(exc, _PROPAGATE)


def _extra_providing(dist: str, name: str) -> bool:
    """Whether the installed distribution ``dist`` has an extra ``name`` that installs ``ember-<name>`` (the
    monorepo's convention: one extra per plugin). ``test`` or ``all`` are extras but provide no plugin ``test``."""
    try:
        requires = metadata.metadata(dist).get_all("Requires-Dist") or []
    except metadata.PackageNotFoundError:
        return False
    want = f"ember-{name}".lower()
    for req in requires:
        spec, _, marker = req.partition(";")
        found = re.match(r"\s*([A-Za-z0-9._-]+)", spec)
        if not found or found.group(1).lower().replace("_", "-") != want:
            continue
        if re.search(r"""extra\s*==\s*['"]""" + re.escape(name) + r"""['"]""", marker):
            return True
    return False


def install_hint(name: str, what: str = "device") -> str:
    """How to get the plugin that provides the backend or decorator ``name``, read from the installed metadata.

    An installed plugin of that entry-point name that is disabled or failed names its distribution; otherwise an
    extra is named only if an installed distribution (``ember``, else ``ember-core``) really has one that installs
    ``ember-<name>``; otherwise no known plugin provides it.
    """
    records = {p.name: p for p in registry.plugins}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name != name:
            continue
        dist = ep.dist.metadata["Name"] if ep.dist else f"module {ep.value}"
        if name in _disabled():
            return f"the plugin {name!r} ({dist}) is installed but disabled by EMBER_DISABLE_PLUGINS"
        record = records.get(name)
        if record is None or record.error:
            return f"the plugin {name!r} comes from {dist}: reinstall or upgrade it (`ember info` shows its error)"
        return f"the installed plugin {name!r} ({dist}) registers no {what} of that name"
    for dist in ("ember", "ember-core"):
        if _extra_providing(dist, name):
            return f"install its plugin with pip install '{dist}[{name}]'"
    return f"no plugin provides this {what}; see docs/plugins"


def _plugin_extras(dist: str) -> list[str]:
    """The extras of the installed distribution ``dist`` that install an ``ember-<extra>`` plugin, in its order."""
    try:
        extras = metadata.metadata(dist).get_all("Provides-Extra") or []
    except metadata.PackageNotFoundError:
        return []
    return [e for e in extras if _extra_providing(dist, e)]


def missing_backend_hint(*, host: bool = False) -> str:
    """What to do when no backend (``host=True``: no host backend) is usable (see :func:`missing_plugin_hint`)."""
    return missing_plugin_hint("a host backend" if host else "a backend")


def missing_plugin_hint(what: str) -> str:
    """What to do when no installed plugin provides ``what`` ("a backend"), read from the installed metadata:
    plugins that are installed but disabled or failed to load, else the extras of the installed ember
    distribution (``ember``, else ``ember-core``) that install plugins. Core names no plugin itself."""
    disabled = _disabled()
    failed = {p.name: p for p in registry.plugins if p.error}
    notes = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        dist = ep.dist.metadata["Name"] if ep.dist else f"module {ep.value}"
        if ep.name in disabled:
            notes.append(f"the plugin {ep.name!r} ({dist}) is disabled by EMBER_DISABLE_PLUGINS")
        elif ep.name in failed:
            notes.append(f"the plugin {ep.name!r} ({dist}) failed to load (`ember info` shows why)")
    if notes:
        return f"{'; '.join(notes)}; it may provide {what}"
    for dist in ("ember", "ember-core"):
        extras = _plugin_extras(dist)
        if extras:  # which extra holds a backend is the plugins' business: list them all, each as a command
            commands = ", ".join(f"pip install '{dist}[{extra}]'" for extra in extras)
            return f"install {what} plugin: `pip install ember` installs the default set; each plugin: {commands}"
    return f"install {what} plugin (`pip install ember` installs the default set); see docs/plugins"


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
        self.namespaces: dict[str, NamespaceSpec] = {}
        self.plugins: list[PluginRecord] = []
        self.conflicts: list[Conflict] = []
        self._loaded = False
        self._loading = False
        # under EMBER_STRICT_PLUGINS=1: the first load error, raised again by every later lookup
        self._fatal: PluginError | None = None
        self._lock = threading.RLock()
        self._pm: Any = None

    # -- discovery -------------------------------------------------------------------------------------------
    def ensure_loaded(self) -> PluginRegistry:
        if not self._loaded:
            with self._lock:
                # _loading: a plugin asking for a device while it is being imported gets what is loaded so far
                # instead of starting discovery again inside itself
                if not self._loaded and not self._loading:
                    self._loading = True
                    try:
                        self._load_entry_points()
                    except BaseException:  # Ctrl-C during discovery: forget the half, the next lookup starts over
                        self._forget()
                        raise
                    finally:
                        self._loading = False
                    # loading happens once, even when a plugin failed: a retry would register the good plugins
                    # twice and blame them instead of the plugin that failed
                    self._loaded = True
        if self._fatal is not None:
            self._raise_fatal()
        return self

    def _forget(self) -> None:
        self.backends, self.decorators, self.ops, self.namespaces = {}, {}, {}, {}
        self.plugins, self.conflicts = [], []
        self._fatal, self._pm = None, None

    def _raise_fatal(self) -> None:
        fatal = self._fatal
        assert fatal is not None
        # a fresh exception with the same message each time (re-raising one object would grow its traceback)
        raise PluginError(str(fatal)) from fatal.__cause__

    def _manager(self) -> Any:
        if self._pm is None:
            import pluggy

            from . import hookspecs

            self._pm = pluggy.PluginManager("ember")
            self._pm.add_hookspecs(hookspecs)
        return self._pm

    def _load_entry_points(self) -> None:
        disabled = _disabled()
        # name order (then distribution): which plugin registers a name first must not depend on sys.path order
        eps = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP),
                     key=lambda ep: (ep.name, ep.dist.metadata["Name"] if ep.dist else "", ep.value))
        for ep in eps:
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
            if any(p.name == ep.name for p in self.plugins):
                other = next(p for p in self.plugins if p.name == ep.name)
                self._fail(record, f"another plugin named {ep.name!r} is already loaded (from "
                           f"{other.distribution or other.module}); entry-point names must be unique", None)
                continue
            try:
                module = ep.load()
            except BaseException as exc:  # SystemExit at import too: a plugin never ends the program
                if _propagates(exc):
                    raise
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
            if pm.has_plugin(record.name) or pm.is_registered(plugin):
                self._fail(record, f"a plugin named {record.name!r} (or this plugin object) is already registered",
                           None)
                return
            try:
                pm.register(plugin, name=record.name)
            except BaseException as exc:
                if _propagates(exc):
                    raise
                # pluggy's message ends with a dump of its internals: keep its first line
                self._fail(record, f"registration failed: {str(exc).splitlines()[0] if str(exc) else exc!r}", exc)
                return
            self.plugins.append(record)
            try:
                lost = self._call_hooks(plugin, record)
            except BaseException as exc:
                if _propagates(exc):
                    raise
                pm.unregister(plugin)
                self.plugins.remove(record)
                self._fail(record, f"register hooks failed: {type(exc).__name__}: {exc}", exc)
                return
            for conflict in lost:
                self._conflict(conflict)

    def _call_hooks(self, plugin: object, record: PluginRecord) -> list[Conflict]:
        """Run the plugin's register hooks, check everything, then commit it all at once (or nothing)."""
        pm = self._manager()
        new_backends: list[BackendSpec] = []
        new_decorators: list[DecoratorSpec] = []
        new_ops: list[OpSpec] = []
        new_namespaces: list[NamespaceSpec] = []

        def reg_backend(name: str, factory: Callable[..., Any], *, contract: int, **kw: Any) -> None:
            new_backends.append(BackendSpec(name, factory, contract, plugin=record.name, **kw))

        def reg_decorator(name: str, factory: Callable[..., Any], *, contract: int, **kw: Any) -> None:
            new_decorators.append(DecoratorSpec(name, factory, contract, plugin=record.name, **kw))

        def reg_op(name: str, default: Callable[..., Any], *, backends: dict | None = None, **kw: Any) -> None:
            new_ops.append(OpSpec(name, default, dict(backends or {}), plugin=record.name, **kw))

        def reg_namespace(name: str, module: str) -> None:
            new_namespaces.append(NamespaceSpec(name, module, plugin=record.name))

        others = [p for p in pm.get_plugins() if p is not plugin]
        for hook, callback in (
            ("register_backends", reg_backend),
            ("register_decorators", reg_decorator),
            ("register_ops", reg_op),
            ("register_namespaces", reg_namespace),
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
            if not isinstance(b.name, str) or not _BACKEND_NAME.fullmatch(b.name):
                raise PluginError(f"backend name {b.name!r} cannot appear in a device string: use lowercase "
                                  "letters, digits, '_' and '-', starting with a letter")
        from ..device import is_device_attribute

        for d in new_decorators:
            if not isinstance(d.name, str) or not d.name.isidentifier() or d.name.startswith("_") \
                    or keyword.iskeyword(d.name) or is_device_attribute(d.name):
                raise PluginError(f"decorator name {d.name!r} must be a public identifier that is not already a "
                                  f"Device attribute (device.{d.name}(...) is how users call it)")
        from .namespaces import check_namespace

        for ns in new_namespaces:
            check_namespace(ns.name, ns.module)
        lost: list[Conflict] = []
        for what, table, specs in (("backend", self.backends, new_backends),
                                   ("decorator", self.decorators, new_decorators), ("op", self.ops, new_ops),
                                   ("namespace", self.namespaces, new_namespaces)):
            for spec in specs:
                old = table.get(spec.name)
                if old is None or old.plugin == record.name:
                    table[spec.name] = spec  # type: ignore[index]
                elif spec.name == record.name and old.plugin != spec.name:
                    lost.append(Conflict(what, spec.name, record.name, old.plugin,
                                         f"the plugin named {spec.name!r} owns the name"))
                    table[spec.name] = spec  # type: ignore[index]
                else:
                    reason = (f"the plugin named {spec.name!r} owns the name" if old.plugin == spec.name
                              else "it registered the name first")
                    lost.append(Conflict(what, spec.name, old.plugin, record.name, reason))
        return lost

    def _conflict(self, conflict: Conflict) -> None:
        self.conflicts.append(conflict)
        loser = next((p for p in self.plugins if p.name == conflict.loser), None)
        if loser is not None:
            loser.conflicts.append(f"{conflict.what} {conflict.name!r}")
        self._report(PluginError(f"ember plugin name conflict: {conflict}"), None)

    def _fail(self, record: PluginRecord, message: str, exc: BaseException | None) -> None:
        record.error = message
        if record not in self.plugins:
            self.plugins.append(record)
        self._report(PluginError(f"ember plugin {record.name!r} ({record.module}): {message}"), exc)

    def _report(self, err: PluginError, cause: BaseException | None) -> None:
        """Log a load problem, or under EMBER_STRICT_PLUGINS=1 make it fatal: while discovering, the first
        problem is kept (the others are still recorded for ``ember info``) and raised by this and every later
        lookup; a direct ``register_plugin`` raises at once."""
        err.__cause__ = cause
        if not _strict():
            log.warning("%s (skipped)", err)
            return
        if self._loading:
            if self._fatal is None:
                self._fatal = err
            return
        raise err

    # -- queries ---------------------------------------------------------------------------------------------
    def backend(self, name: str) -> BackendSpec:
        self.ensure_loaded()
        spec = self.backends.get(name)
        if spec is None:
            installed = f"installed backends: {', '.join(sorted(self.backends)) or 'none'}"
            if name in self.decorators:
                example = next(iter(sorted(self.backends)), "cpu")
                raise PluginError(f"{name!r} is a decorator, not a backend: write it after a backend, e.g. "
                                  f"'{example}+{name}' ({installed})")
            failed = [p for p in self.plugins if p.name == name and p.error]
            why = f" (the plugin is installed but failed to load: {failed[0].error})" if failed else ""
            raise PluginError(f"no backend named {name!r} is installed{why}; {install_hint(name)} ({installed})")
        return spec

    def decorator(self, name: str) -> DecoratorSpec | None:
        self.ensure_loaded()
        return self.decorators.get(name)

    def automatic_decorators(self) -> list[DecoratorSpec]:
        """Decorators applied to every device unless it opts out, in name order (see ``register_decorators``)."""
        self.ensure_loaded()
        return sorted((d for d in self.decorators.values() if d.automatic), key=lambda d: d.name)

    def differentiable_decorator(self) -> DecoratorSpec | None:
        """The installed decorator that records gradients (``differentiable=True``), first by name; None if none."""
        self.ensure_loaded()
        found = sorted((d for d in self.decorators.values() if d.differentiable), key=lambda d: d.name)
        return found[0] if found else None

    def hook_results(self, name: str, *, check: bool = True) -> dict[str, Any]:
        """Call the argument-less hook ``name`` (``plugin_info``) on each loaded plugin: {plugin: result}.

        A plugin whose hook raises gets ``{"error": "..."}``: ``ember info`` must work even when a plugin is broken.
        ``check=False`` asks the plugins that did load even when strict mode made a load error fatal.
        """
        try:
            self.ensure_loaded()
        except PluginError:
            if check:
                raise
        results: dict[str, Any] = {}
        with self._lock:
            for impl in getattr(self._manager().hook, name).get_hookimpls():
                try:
                    results[impl.plugin_name] = impl.function()
                except BaseException as exc:
                    if _propagates(exc):
                        raise
                    results[impl.plugin_name] = {"error": f"{type(exc).__name__}: {exc}"}
        return results

    def reset(self) -> None:
        """Forget everything (tests). The next query rediscovers entry points."""
        with self._lock:
            self.__init__()  # type: ignore[misc]


registry = PluginRegistry()
