"""Devices: run-time values that decide where and how every op runs.

A :class:`Device` names a backend kind, an index, backend options, and a chain of decorators
(``Device.flex().autodiff()``). Devices are interned -- equal devices are the same object -- and each resolves
*once* to its *stack*: the backend instance wrapped by its decorators. The per-op path reads ``device._stack``
and never touches the plugin machinery.

The *host device* (:meth:`Device.host`) is whichever installed backend declares that its memory is the host's
(``register(..., host=True)``); core finds it by that capability and never by a backend's name.
"""

from __future__ import annotations

import ast
import os
import re
import secrets
import sys
import threading
import types
from typing import Any

from .errors import DeviceError, PluginError

_Options = tuple[tuple[str, Any], ...]
_Decorators = tuple[tuple[str, _Options], ...]

# Devices are interned: equal devices are one object, so device checks are identity tests. (Their stacks are
# built by ember.dispatch.resolve_stack.)
_interned: dict[tuple[str, int, _Options, _Decorators], Device] = {}
_lock = threading.RLock()


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _spec_error(spec: str, pos: int, what: str) -> DeviceError:
    return DeviceError(f"cannot parse device {spec!r} at position {pos}: {what}")


def _split_top_level(spec: str) -> list[tuple[int, str]]:
    """``spec`` split at the ``+`` signs outside parentheses and quotes, with each part's start offset."""
    parts: list[tuple[int, str]] = []
    depth, quote, start, escaped = 0, "", 0, False
    for i, ch in enumerate(spec):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise _spec_error(spec, i, "')' without a matching '('")
        elif ch == "+" and depth == 0:
            parts.append((start, spec[start:i]))
            start = i + 1
    if quote:
        raise _spec_error(spec, len(spec), f"unterminated string (missing {quote})")
    if depth:
        raise _spec_error(spec, len(spec), "missing ')'")
    parts.append((start, spec[start:]))
    return parts


def _option_node(spec: str, pos: int, node: ast.expr) -> Any:
    """One option value: a Python literal (8, 0.5, False, 'text', (1, 2)) or a bare word, taken as text
    (``checkpointing=balanced``). Nothing is evaluated."""
    if isinstance(node, ast.Name):
        return node.id
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _spec_error(spec, pos + node.col_offset, f"option value {ast.unparse(node)!r} is not a literal "
                          "(a number, True/False/None, a quoted string or a plain word)") from None


def _parse_options(spec: str, pos: int, text: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``text`` is what stands between a decorator's parentheses, starting at offset ``pos`` of ``spec``."""
    if not text.strip():
        return (), {}
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        col = getattr(exc, "offset", None)
        where = pos + max(0, min(len(text), (col or 3) - 3))
        raise _spec_error(spec, where, f"malformed decorator options ({text!r})") from None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"
            and call.end_col_offset == len(text) + 3):
        raise _spec_error(spec, pos, f"malformed decorator options ({text!r})")
    args = tuple(_option_node(spec, pos - 2, a) for a in call.args if not isinstance(a, ast.Starred))
    if len(args) != len(call.args):
        raise _spec_error(spec, pos, "'*' is not allowed in decorator options")
    options: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise _spec_error(spec, pos + kw.col_offset - 2, "'**' is not allowed in decorator options")
        options[kw.arg] = _option_node(spec, pos - 2, kw.value)
    return args, options


def _freeze(options: dict[str, Any]) -> _Options:
    return tuple(sorted(options.items()))


def _decorator_spec(name: str) -> Any:
    """The registered decorator ``name``, or None."""
    from .plugins.manager import registry

    return registry.decorator(name)


class _DeviceType(type):
    """Gives :class:`Device` a named constructor per backend kind: ``Device.<kind>(index=0, **options)`` is
    ``Device(kind, index, options)``, checked when called (``Device.flex()``, ``Device.opencl(1)``,
    ``Device.cuda(0)``), the way ``device.<decorator>(...)`` works for decorators. Core defines none of them by
    name: a kind works once a plugin registers it, and a missing one fails with its plugin's install hint."""

    def __getattr__(cls, name: str) -> Any:
        # only reached when normal lookup fails; dunder/private names and names no backend could have stay errors
        if name.startswith("_") or not _BACKEND_ATTR.fullmatch(name):
            raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")

        def construct(*args: Any, **options: Any) -> Device:
            # a backend may name options that positional arguments fill instead of the index (a remote
            # device's address: Device.remote("ember://host:7433/flex")); otherwise Device.<kind>(index=0)
            from .plugins.manager import registry

            spec = registry.ensure_loaded().backends.get(name)
            positional = spec.positional if spec is not None else ()
            if positional:
                if len(args) > len(positional):
                    raise DeviceError(f"Device.{name}(): takes {len(positional)} positional argument(s) "
                                      f"({', '.join(positional)}), got {len(args)}")
                both = sorted(set(positional[:len(args)]) & set(options))
                if both:
                    raise DeviceError(f"Device.{name}(): option(s) {both} given both by position and by keyword")
                named = {**dict(zip(positional, args)), **options}
                return cls(name, named.pop("index", 0), _freeze(named))._checked()
            if len(args) > 1:
                raise DeviceError(f"Device.{name}(): takes the device index and keyword options, got {args!r}")
            index = args[0] if args else options.pop("index", 0)
            return cls(name, index, _freeze(options))._checked()

        construct.__name__ = construct.__qualname__ = name
        construct.__doc__ = f"``Device({name!r}, index, options)``, checked: the {name} backend must be installed."
        return construct


# a backend kind that is also a Python identifier (backend names allow '-' too; those use Device("a-b", i))
_BACKEND_ATTR = re.compile(r"[a-z][a-z0-9_]*")


def is_device_attribute(name: str) -> bool:
    """Whether ``name`` is a real attribute of :class:`Device` (not a named backend constructor), which a
    decorator may not take as its name."""
    return any(name in vars(k) for k in Device.__mro__)


class Device(metaclass=_DeviceType):
    """A compute device. Create with the named constructors of the installed backends (``Device.flex()``,
    ``Device.opencl(0)``, any ``Device.<kind>(index, **options)``), ``Device("kind", index)``,
    ``Device.parse("cuda:1")``, :meth:`Device.host` or :meth:`Device.default`; decorate with
    ``device.<decorator>(...)`` once the decorator's plugin is installed (``device.autodiff()``)."""

    __slots__ = ("kind", "index", "options", "decorators", "_stack", "_default_float", "__weakref__")

    kind: str
    index: int
    options: _Options
    decorators: _Decorators

    def __new__(cls, kind: str, index: int = 0, options: _Options = (), decorators: _Decorators = ()) -> Device:
        if not isinstance(kind, str) or not kind:
            raise DeviceError(f"Device: kind must be a non-empty string, got {kind!r}")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise DeviceError(f"Device({kind!r}): index must be a non-negative int, got {index!r}")
        key = (kind, index, tuple(options), tuple(decorators))
        try:
            dev = _interned.get(key)
        except TypeError:  # a list or dict among the options: devices are interned, so options must hash
            raise DeviceError(f"Device({kind!r}): option values must be hashable (a tuple, not a list or dict), "
                              f"got options {_shown(tuple(options))!r} and decorators {decorators!r}") from None
        if dev is None:
            with _lock:
                dev = _interned.get(key)
                if dev is None:
                    dev = object.__new__(cls)
                    dev.kind, dev.index, dev.options, dev.decorators = key
                    dev._stack = None
                    dev._default_float = None
                    _interned[key] = dev
        return dev

    def __reduce__(self) -> tuple[Any, ...]:
        return (Device, (self.kind, self.index, self.options, self.decorators))

    # -- constructors ------------------------------------------------------------------------------------------
    # Device.<kind>(index, **options) comes from the metaclass for every kind (see _DeviceType); core's behaviour
    # never depends on which kind is which: the host device is found by capability. Only constructors whose
    # arguments are not (index, **options) are written here.
    @classmethod
    def host(cls) -> Device:
        """The host device: the installed backend registered with ``host=True`` (its handles live in host memory,
        so numpy arrays are adopted and read back without copies); the highest priority one when several are.
        ``.cpu()``, ``ember.from_numpy`` and ``records.load_into`` use it, and the device string ``"cpu"`` names it."""
        return host_device()


    @classmethod
    def parse(cls, spec: str) -> Device:
        """``"flex"``, ``"cuda:1"``, ``"opencl:0"``; decorators with ``+``: ``"flex+autodiff"``, with options
        in parentheses: ``"flex+autodiff(checkpointing=balanced)"`` (what ``str(device)`` prints). Only installed
        decorators may be named; an automatic one also takes its on/off switch: ``"flex+fusion(False)"``.
        ``"cpu"`` (as PyTorch spells it) is the host device, :meth:`Device.host`, unless an installed backend is
        itself named ``cpu``: ``"cpu+autodiff"`` is ``Device.host().autodiff()``.
        Anything else is a :class:`DeviceError` naming the string and the position of the problem."""
        if not isinstance(spec, str):
            raise DeviceError(f"Device.parse: expected a device string, got {type(spec).__name__}: {spec!r}")
        parts = _split_top_level(spec)
        start, base = parts[0]
        kind, colon, idx = base.partition(":")
        if not _KIND.fullmatch(kind.strip()):
            what = "missing backend name" if not kind.strip() else f"{kind.strip()!r} is not a backend name"
            raise _spec_error(spec, start + len(kind) - len(kind.lstrip()), f"{what} (e.g. 'cpu' or 'cuda:1')")
        idx = idx.strip()
        if colon and not idx.isdigit():  # the message the docs show for "cuda:x"
            raise DeviceError(f"cannot parse device {spec!r}: index {idx!r} is not an int")
        kind, index = kind.strip().lower(), int(idx) if colon else 0
        if kind == _CPU_ALIAS and not _has_backend(kind):
            dev = host_device()
            if index != dev.index:
                raise DeviceError(f"cannot parse device {spec!r}: 'cpu' is the host device {dev} and has only "
                                  f"index {dev.index}")
        else:
            dev = cls(kind, index)._checked()
        for start, part in parts[1:]:
            text = part.strip()
            pos = start + len(part) - len(part.lstrip())
            name_match = _NAME.match(text)
            if name_match is None:
                raise _spec_error(spec, pos, f"expected a decorator name after '+', got {text[:20]!r}")
            name = name_match.group()
            rest = text[len(name):].lstrip()
            rest_pos = pos + len(text) - len(text[len(name):].lstrip())
            if rest and not (rest.startswith("(") and rest.endswith(")")):
                raise _spec_error(spec, rest_pos, f"unexpected {rest[:20]!r} after decorator {name!r} (options go "
                                  "in parentheses: name(key=value, ...))")
            args, options = _parse_options(spec, rest_pos + 1, rest[1:-1]) if rest else ((), {})
            deco = _decorator_spec(name) if not name.startswith("_") else None
            if deco is None:
                raise DeviceError(f"cannot parse device {spec!r}: {_unknown_decorator(name)}")
            try:
                dev = dev._decorated(name, deco, args, options)
            except DeviceError as exc:  # e.g. positional options of a named decorator: say which string
                raise DeviceError(f"cannot parse device {spec!r}: {exc}") from None
        return dev

    @classmethod
    def default(cls) -> Device:
        """``EMBER_DEVICE`` when set, else the best installed real hardware (gpu > cpu > emulated)."""
        spec = os.environ.get("EMBER_DEVICE", "").strip()
        if spec:
            return cls.parse(spec)
        from .plugins.manager import registry

        registry.ensure_loaded()
        rank = {"gpu": 2, "cpu": 1, "emulated": 0}
        best = None
        for spec_ in registry.backends.values():
            if spec_.kind not in rank or spec_.device_count() < 1:
                continue
            score = (rank.get(spec_.kind_of(0), 0), spec_.priority)
            if best is None or score > best[0]:
                best = (score, spec_.name)
        if best is None:
            from .plugins.manager import missing_backend_hint

            raise PluginError(f"no ember backend is installed or available; {missing_backend_hint()}")
        return cls(best[1], 0)

    def _checked(self) -> Device:
        """Fail now, with the pip extra to install, if the backend plugin is missing or the index is absent."""
        from .plugins.manager import registry

        spec = registry.backend(self.kind)
        count = spec.device_count()
        if self.index >= count:
            raise DeviceError(
                f"Device.{self.kind}({self.index}): only {count} {self.kind} device(s) found"
                + ("" if count else f" ({spec.install_hint or f'is the {self.kind} driver/runtime installed?'})")
            )
        return self

    # -- decorators ----------------------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        deco = _decorator_spec(name)
        if deco is None:
            raise AttributeError(f"Device has no attribute {name!r}; {_unknown_decorator(name)}")

        def decorate(*args: Any, **options: Any) -> Device:
            return self._decorated(name, deco, args, options)

        decorate.__name__ = name
        return decorate

    def _decorated(self, name: str, spec: Any, args: tuple[Any, ...], options: dict[str, Any]) -> Device:
        """This device with the registered decorator ``name`` applied (or, for an automatic one, set)."""
        if not spec.automatic:
            if len(args) > len(spec.positional):
                raise DeviceError(f"{self}.{name}(): options are keyword arguments"
                                  + (f" after {len(spec.positional)} positional ({', '.join(spec.positional)})"
                                     if spec.positional else "") + f", got {args!r}")
            named = dict(zip(spec.positional, args))
            both = sorted(set(named) & set(options))
            if both:
                raise DeviceError(f"{self}.{name}(): option(s) {both} given both by position and by keyword")
            options = {**named, **options}
            return Device(self.kind, self.index, self.options, self.decorators + ((name, _freeze(options)),))
        # an automatic decorator is on by default where it applies to the backend: name(False) opts out, name()
        # turns it on whatever the backend prefers (it is then named), name(**options) sets its options
        if len(args) > 1 or (args and not isinstance(args[0], bool)):
            raise DeviceError(f"{self}.{name}(): expected one bool (on/off) and keyword options, got {args!r}")
        if "enabled" in options:  # a bool, or a device string's spelling of one ("enabled=off")
            flag = str(options.pop("enabled")).strip().lower()
            if flag not in _TRUE + _FALSE:
                raise DeviceError(f"{self}.{name}(): enabled must be a bool, got {flag!r}")
            args = args or (flag in _TRUE,)
        if args and not args[0]:
            if options:
                raise DeviceError(f"{self}.{name}(False): options {sorted(options)} make no sense when off")
            # off is what the device is anyway when the decorator is switched off for all (EMBER_FUSION=0)
            options = {"enabled": False} if spec.on_by_default() else {}
        elif not spec.on_by_default():
            options = {}  # the global switch wins: settings cannot turn it back on, so they are not kept
        turned_on = not (args and not args[0])
        rest = [d for d in self.decorators if d[0] != name]
        if options or (turned_on and spec.on_by_default()):
            rest.append((name, _freeze(options)))
        # settings of automatic decorators come first, in name order: they apply innermost whatever the order
        # they were given in, so flex+autodiff+fusion(False) and flex+fusion(False)+autodiff are one device
        automatic = {d.name for d in _automatic_decorators()}
        ordered = sorted((d for d in rest if d[0] in automatic), key=lambda d: d[0])
        ordered += [d for d in rest if d[0] not in automatic]
        return Device(self.kind, self.index, self.options, tuple(ordered))

    @property
    def inner(self) -> Device:
        """This device without its outermost decorator."""
        return Device(self.kind, self.index, self.options, self.decorators[:-1])

    @property
    def base(self) -> Device:
        """This device without any decorator."""
        return Device(self.kind, self.index, self.options)

    # -- resolution ------------------------------------------------------------------------------------------
    @property
    def stack(self) -> Any:
        """The resolved backend stack (the backend wrapped by the decorators); built on first use."""
        s = self._stack
        if s is None:
            s = self._resolve()
        return s

    def _resolve(self) -> Any:
        from .dispatch import resolve_stack

        with _lock:
            if self._stack is None:
                stack = resolve_stack(self)
                _apply_global_seed(stack)  # a device first used after ember.manual_seed(n) starts from n too
                self._stack = stack
            return self._stack

    # -- queries and control -----------------------------------------------------------------------------------
    def sync(self) -> None:
        """Block until all work queued on this device is done."""
        self.stack.sync()

    def seed(self, seed: int) -> None:
        """Reseed this device's random stream (shared by all decorations of the same device)."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise DeviceError(f"{self}.seed: seed must be an int, got {type(seed).__name__}")
        self.stack.seed(seed)

    def supports_dtype(self, dtype: Any) -> bool:
        from .dtypes import as_dtype

        return as_dtype(dtype) in self.stack.supported_dtypes

    def memory_dry_run(self) -> Any:
        """A context manager that records the allocations of the workload run inside it and sizes the device's
        memory pools from them (a no-op context on backends without a pooling allocator). It yields a dict that
        holds the recorded statistics once the block exits."""
        return self.stack.memory_dry_run()

    def memory_report(self) -> dict[str, Any]:
        return dict(self.stack.memory_report())

    @property
    def default_dtype(self) -> Any:
        """Float dtype used for Python floats on this device (the global default unless set per device)."""
        if self._default_float is not None:
            return self._default_float
        from .dtypes import get_default_dtype

        return get_default_dtype()

    def set_default_dtype(self, dtype: Any) -> None:
        """Set this device's default float dtype (None restores the global default)."""
        from .dtypes import as_dtype
        from .errors import DTypeError

        if dtype is None:
            self._default_float = None
            return
        d = as_dtype(dtype)
        if not d.is_floating_point:
            raise DTypeError(f"{self}.set_default_dtype: only floating dtypes are allowed, got {d}")
        if not self.supports_dtype(d):
            raise DTypeError(f"{self}.set_default_dtype: the device does not support {d}")
        self._default_float = d

    @property
    def type(self) -> str:
        """The backend kind, as ``torch.device.type``."""
        return self.kind

    def _labelled_decorators(self) -> _Decorators:
        """The decorators as labels show them: an automatic decorator switched off for every device
        (``EMBER_FUSION=0``) is shown as opted out, so a log line says what ran. Plugins are not loaded for this:
        before discovery no device has run anything."""
        from .plugins import manager

        if not manager.registry._loaded or manager.registry._fatal is not None:
            return self.decorators
        named = {d[0] for d in self.decorators}
        off = [(d.name, (("enabled", False),)) for d in manager.registry.automatic_decorators()
               if d.name not in named and not d.on_by_default()]
        if not off:
            return self.decorators
        automatic = {d.name for d in manager.registry.automatic_decorators()}
        autos = sorted([d for d in self.decorators if d[0] in automatic] + off, key=lambda d: d[0])
        return tuple(autos) + tuple(d for d in self.decorators if d[0] not in automatic)

    def __str__(self) -> str:
        s = self.kind if not self.index else f"{self.kind}:{self.index}"
        for name, opts in self._labelled_decorators():
            s += f"+{name}"
            if opts:  # "flex+autodiff(checkpointing=balanced)": two devices never print alike
                s += "(" + ",".join(f"{k}={_label_value(v)}" for k, v in opts) + ")"
        return s

    def __repr__(self) -> str:
        named = _BACKEND_ATTR.fullmatch(self.kind) and not is_device_attribute(self.kind)
        if named and not self.options:  # the named constructor: Device.flex(), Device.opencl(1)
            r = f"Device.{self.kind}({self.index or ''})"
        else:
            r = f"Device({self.kind!r}, {self.index}" + (f", {_shown(self.options)!r})" if self.options else ")")
        for name, opts in self._labelled_decorators():
            r += f".{name}({', '.join(f'{k}={v!r}' for k, v in opts)})"
        return r


#: option names whose values are credentials (a remote device's token): reprs, logs and tracebacks show *** instead
_SECRET_OPTION = re.compile(r"token|secret|password|passphrase|credential|api_?key", re.I)


def _shown(options: _Options) -> dict[str, Any]:
    """The options as a repr may show them: credentials redacted."""
    return {k: "***" if _SECRET_OPTION.search(k) else v for k, v in options}


def _label_value(value: Any) -> str:
    """An option value as a device string spells it so that Device.parse reads the same value back: a plain
    word bare (``balanced``), any other text quoted, everything else as its Python literal."""
    if isinstance(value, str):
        plain = _NAME.fullmatch(value) and value not in ("True", "False", "None")
        return value if plain else repr(value)
    return repr(value)


#: the device string PyTorch users write for host memory; Device.parse maps it to the host device
_CPU_ALIAS = "cpu"


def _has_backend(name: str) -> bool:
    from .plugins.manager import registry

    return name in registry.ensure_loaded().backends


def host_device() -> Device:
    """The host device (see :meth:`Device.host`): among the installed backends registered with ``host=True`` and
    with a device present, the highest ``priority`` (then a real CPU before an emulated one, then name order).
    None installed is a :class:`DeviceError` that lists the installed backends and says what to install."""
    from .plugins.manager import missing_backend_hint, registry

    registry.ensure_loaded()
    rank = {"cpu": 1, "emulated": 0}
    best: tuple[tuple[int, int], str] | None = None
    # name order and a strict ">": on a full tie the alphabetically first backend wins, whatever the load order
    for spec in sorted(registry.backends.values(), key=lambda s: s.name):
        if not spec.host or spec.device_count() < 1:
            continue
        score = (spec.priority, rank.get(spec.kind_of(0), -1))
        if best is None or score > best[0]:
            best = (score, spec.name)
    if best is None:
        installed = ", ".join(sorted(registry.backends)) or "none"
        raise DeviceError("no host device: no installed backend is registered with host=True (a backend whose "
                          "memory is the host's, which .cpu(), from_numpy and load need; installed backends: "
                          f"{installed}); {missing_backend_hint(host=True)}")
    return Device(best[1], 0)


def is_host(device: Device) -> bool:
    """Whether ``device`` is the host device itself (no decorators); never raises (``repr`` asks it)."""
    if device.decorators:
        return False
    try:
        return device is host_device()
    except Exception:  # no host backend installed, or plugins failed: then no device is the host
        return False


def _automatic_decorators() -> list[Any]:
    from .plugins.manager import registry

    return registry.automatic_decorators()


def _unknown_decorator(name: str) -> str:
    """Why ``name`` cannot be used as a decorator, with the installed ones and how to get it."""
    from .plugins.manager import install_hint, registry

    installed = ", ".join(sorted(registry.decorators)) or "none"
    return (f"{name!r} is not an installed decorator (installed decorators: {installed}); "
            f"{install_hint(name, 'decorator')}")


def as_device(obj: Any) -> Device:
    """Accept a Device, a spec string (``"flex"``, ``"cuda:0"``) or None (the default device)."""
    if obj is None:
        return default_device()
    if isinstance(obj, Device):
        return obj
    if isinstance(obj, str):
        return Device.parse(obj)
    raise DeviceError(f"expected a Device or a device string, got {type(obj).__name__}: {obj!r}")


_default: Device | None = None


def default_device() -> Device:
    """The device used when an op is given no device: set by set_default_device, else Device.default()."""
    global _default
    if _default is None:
        _default = Device.default()
    return _default


def set_default_device(device: Device | str | None) -> None:
    """Set the device used by factories without ``device=`` (None: back to ``Device.default()``)."""
    global _default
    _default = None if device is None else as_device(device)


# -- the global seed (ember.manual_seed) --------------------------------------------------------------------------
# ember.manual_seed(n) seeds every device's stream with n: those already resolved at once, the others when they are
# first resolved (Device._resolve calls _apply_global_seed), so a device's stream never depends on whether it was
# used before or after the call. A backend is shared by all decorations of a device, so it is seeded once per
# manual_seed, tracked by identity (a backend rebuilt after its cache was cleared is seeded again). Before any
# manual_seed, backends keep the seed they start with. Host-side randomness (the DataLoader's shuffle seed) draws
# from one numpy generator seeded by the same n, so it never perturbs the device streams, nor they it.
_MASK64 = 2**64 - 1
_global_seed: int | None = None  # what manual_seed/seed last gave every device; None: never called
_initial_seed: int | None = None  # the host generator's seed (drawn from the OS at first use when never given)
_host_rng: Any = None
_seeded_backends: dict[int, Any] = {}  # id -> backend (the reference keeps the id from being reused)


def check_seed(seed: Any, op: str) -> int:
    """``seed`` as PyTorch takes it: an int in [-2**63, 2**64); negative seeds wrap modulo 2**64."""
    import numbers

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise DeviceError(f"{op}: seed must be an int, got {type(seed).__name__}: {seed!r}")
    seed = int(seed)
    if not -(2**63) <= seed <= _MASK64:
        raise DeviceError(f"{op}: seed {seed} is out of range [-2**63, 2**64)")
    return seed & _MASK64


def _apply_global_seed(stack: Any) -> None:
    """Seed a freshly resolved stack with the global seed unless its backend was already seeded with it."""
    if _global_seed is None:
        return
    from .dispatch import stack_chain

    backend = list(stack_chain(stack))[-1]
    with _lock:
        if id(backend) in _seeded_backends:
            return
        # the backend itself: every decoration shares its stream, and seed is a required primitive of backends only
        # (a minimal decorator need not forward it)
        backend.seed(_global_seed)
        _seeded_backends[id(backend)] = backend


def seed_all(seed: int) -> None:
    """Seed every device's random stream and ember's host generator with ``seed`` (``ember.manual_seed(seed)``)."""
    global _global_seed, _initial_seed, _host_rng
    seed = check_seed(seed, "manual_seed")
    with _lock:
        _global_seed = _initial_seed = seed
        _host_rng = None
        _seeded_backends.clear()
        for dev in list(_interned.values()):
            if dev._stack is not None:
                _apply_global_seed(dev._stack)


def initial_seed() -> int:
    """The seed of ember's host generator: the last ``manual_seed``/``seed`` value, else one drawn from the OS at
    first use (log it and pass it to ``manual_seed`` to repeat an unseeded run's host-side draws)."""
    global _initial_seed
    with _lock:
        if _initial_seed is None:
            _initial_seed = secrets.randbits(63)
        return _initial_seed


def draw_seed() -> int:
    """A fresh seed in [0, 2**63) from ember's host generator (what ``torch.randint`` on the default generator gives
    a DataLoader): the same sequence after every ``manual_seed(n)`` with the same n."""
    global _host_rng
    with _lock:
        if _host_rng is None:
            import numpy as np

            _host_rng = np.random.Generator(np.random.PCG64(initial_seed()))
        return int(_host_rng.integers(0, 2**63))


# -- ember.device(...): the module is callable, as torch.device is a type -----------------------------------------
class _DeviceModule(types.ModuleType):
    """``ember.device`` is this module; calling it makes a device as ``torch.device`` does, and
    ``isinstance(x, ember.device)`` asks whether x is a :class:`Device`."""

    def __call__(self, type: Any, index: int | None = None) -> Device:  # noqa: A002 - torch.device's parameter
        """``ember.device("cpu")``, ``ember.device("cuda:0")``, ``ember.device("flex+autodiff")``,
        ``ember.device("cuda", 0)`` or a :class:`Device` (returned as it is): see :meth:`Device.parse`."""
        if isinstance(type, Device):
            if index is not None:
                raise DeviceError(f"ember.device({type}, {index!r}): an index goes with a kind string, not a Device")
            return type
        if not isinstance(type, str):
            raise DeviceError(f"ember.device: expected a device string or a Device, got {_builtin_type(type).__name__}"
                              f": {type!r} (write the kind too, e.g. ember.device('cpu') or ember.device('flex', 0))")
        if index is None:
            return Device.parse(type)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise DeviceError(f"ember.device({type!r}, {index!r}): index must be a non-negative int")
        if ":" in type or "+" in type:
            raise DeviceError(f"ember.device({type!r}, {index}): give the index either in the string or as the "
                              "argument, with a plain kind such as 'flex'")
        return Device.parse(f"{type}:{index}")

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, Device)


_builtin_type = type  # the builtin, which __call__ shadows with torch.device's parameter name
sys.modules[__name__].__class__ = _DeviceModule
