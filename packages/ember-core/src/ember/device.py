"""Devices: run-time values that decide where and how every op runs.

A :class:`Device` names a backend kind, an index, backend options, and a chain of decorators
(``Device.flex().autodiff()``). Devices are interned -- equal devices are the same object -- and each resolves
*once* to its *stack*: the backend instance wrapped by its decorators. The per-op path reads ``device._stack``
and never touches the plugin machinery.
"""

from __future__ import annotations

import ast
import os
import threading
from typing import Any

from .errors import DeviceError, PluginError

_Options = tuple[tuple[str, Any], ...]
_Decorators = tuple[tuple[str, _Options], ...]

# Resolved backends are shared by every device with the same (kind, index, options): decorators wrap the same
# inner backend, so Device.flex() and Device.flex().autodiff() see one memory pool and one random stream. The
# backend under its automatic decorators is cached too, keyed by those decorators' settings.
_backend_cache: dict[tuple[Any, ...], Any] = {}
_interned: dict[tuple[str, int, _Options, _Decorators], Device] = {}
_lock = threading.RLock()


def _option_value(text: str) -> Any:
    """A decorator option parsed from a device string: a Python literal (8, 0.5, False) or else the text, so
    ``Device.parse(str(d)) is d`` for options of any literal type."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _freeze(options: dict[str, Any]) -> _Options:
    return tuple(sorted(options.items()))


class Device:
    """A compute device. Create with the constructors (``Device.flex()``, ``Device.cuda(0)``, ...) or
    ``Device.parse("cuda:1")``; decorate with ``device.<decorator>(...)`` once the decorator's plugin is
    installed (``device.autodiff()``)."""

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
        dev = _interned.get(key)
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
    @classmethod
    def flex(cls) -> Device:
        """The portable CPU backend (numpy and its BLAS)."""
        return cls("flex", 0)._checked()

    @classmethod
    def cuda(cls, index: int = 0) -> Device:
        return cls("cuda", index)._checked()

    @classmethod
    def rocm(cls, index: int = 0) -> Device:
        return cls("rocm", index)._checked()

    @classmethod
    def opencl(cls, index: int = 0) -> Device:
        return cls("opencl", index)._checked()

    @classmethod
    def wgpu(cls, index: int = 0, **options: Any) -> Device:
        return cls("wgpu", index, _freeze(options))._checked()

    @classmethod
    def remote(cls, address: str, **options: Any) -> Device:
        return cls("remote", 0, _freeze({"address": address, **options}))._checked()

    @classmethod
    def router(cls, *devices: Device, **options: Any) -> Device:
        return cls("router", 0, _freeze({"devices": tuple(devices), **options}))._checked()

    @classmethod
    def parse(cls, spec: str) -> Device:
        """``"flex"``, ``"cuda:1"``, ``"opencl:0"``; decorators with ``+``: ``"flex+autodiff"``, with options
        in parentheses: ``"flex+autodiff(checkpointing=balanced)"`` (what ``str(device)`` prints)."""
        base, *decos = [p.strip() for p in spec.split("+")]
        kind, _, idx = base.partition(":")
        try:
            index = int(idx) if idx else 0
        except ValueError:
            raise DeviceError(f"cannot parse device {spec!r}: index {idx!r} is not an int") from None
        dev = cls(kind.strip().lower(), index)._checked()
        for deco in decos:
            name, _, args = deco.partition("(")
            options = {}
            for item in filter(None, args.rstrip(")").split(",")):
                key, eq, value = item.partition("=")
                if not eq:
                    raise DeviceError(f"cannot parse device {spec!r}: decorator option {item!r} is not key=value")
                options[key.strip()] = _option_value(value.strip())
            dev = getattr(dev, name.strip())(**options)
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
            raise PluginError(
                "no ember backend is installed or available; install the CPU backend with pip install 'ember[flex]'"
            )
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
        from .plugins.manager import registry

        if registry.decorator(name) is None:
            raise AttributeError(
                f"Device has no attribute {name!r}; if it is a decorator, install its plugin with "
                f"pip install 'ember[{name}]' (installed decorators: {sorted(registry.decorators) or 'none'})"
            )

        spec = registry.decorator(name)

        def decorate(*enabled: bool, **options: Any) -> Device:
            if not spec.automatic:
                if enabled:
                    raise DeviceError(f"{self}.{name}(): options are keyword arguments, got {enabled!r}")
                return Device(self.kind, self.index, self.options, self.decorators + ((name, _freeze(options)),))
            # an automatic decorator is on by default: name(False) opts out, name(**options) sets its options
            if len(enabled) > 1 or (enabled and not isinstance(enabled[0], bool)):
                raise DeviceError(f"{self}.{name}(): expected one bool (on/off) and keyword options, got {enabled!r}")
            if "enabled" in options:  # a bool, or a device string's spelling of one ("enabled=off")
                flag = str(options.pop("enabled")).strip().lower()
                if flag not in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                    raise DeviceError(f"{self}.{name}(): enabled must be a bool, got {flag!r}")
                enabled = enabled or (flag in ("true", "1", "yes", "on"),)
            if enabled and not enabled[0]:
                if options:
                    raise DeviceError(f"{self}.{name}(False): options {sorted(options)} make no sense when off")
                options = {"enabled": False}
            rest = tuple(d for d in self.decorators if d[0] != name)
            if options:
                rest += ((name, _freeze(options)),)
            return Device(self.kind, self.index, self.options, rest)

        decorate.__name__ = name
        return decorate

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
        from .plugins.manager import registry

        with _lock:
            if self._stack is not None:
                return self._stack
            bkey = (self.kind, self.index, self.options)
            backend = _backend_cache.get(bkey)
            if backend is None:
                spec = registry.backend(self.kind)
                try:
                    backend = spec.factory(self.index, **dict(self.options))
                except Exception as exc:
                    raise DeviceError(f"could not create device {self}: {type(exc).__name__}: {exc}") from exc
                _backend_cache[bkey] = backend
            named = dict(self.decorators)
            autos = tuple((d.name, named.get(d.name, ())) for d in registry.automatic_decorators())
            # the automatically decorated backend is shared too: flex and flex+autodiff use one fusion stack
            stack = _backend_cache.get((*bkey, autos))
            if stack is None:
                stack = backend
                for name, opts in autos:
                    kw = dict(opts)
                    if kw.pop("enabled", True) is not False:
                        stack = registry.decorator(name).factory(stack, **kw)
                _backend_cache[(*bkey, autos)] = stack
            for name, opts in self.decorators:
                deco = registry.decorator(name)
                if deco is None:
                    raise PluginError(f"decorator {name!r} is not installed; pip install 'ember[{name}]'")
                if not deco.automatic:
                    stack = deco.factory(stack, **dict(opts))
            self._stack = stack
            return stack

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

    def __str__(self) -> str:
        s = self.kind if not self.index else f"{self.kind}:{self.index}"
        for name, opts in self.decorators:
            s += f"+{name}"
            if opts:  # "flex+autodiff(checkpointing=balanced)": two devices never print alike
                s += "(" + ",".join(f"{k}={v}" for k, v in opts) + ")"
        return s

    def __repr__(self) -> str:
        if self.kind in ("flex",) and not self.options:
            r = f"Device.{self.kind}()"
        elif not self.options:
            r = f"Device.{self.kind}({self.index})"
        else:
            r = f"Device({self.kind!r}, {self.index}, {dict(self.options)!r})"
        for name, opts in self.decorators:
            r += f".{name}({', '.join(f'{k}={v!r}' for k, v in opts)})"
        return r


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
