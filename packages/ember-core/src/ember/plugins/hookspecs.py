"""The plugin contract: every hook an ember plugin may implement.

A plugin is a module (or object) exposed under the entry-point group ``ember``. It implements any of the hooks
below with ``@ember.plugins.hookimpl``. Hooks are called once, lazily, the first time a device is resolved or
``ember.info()`` is asked for -- never per op. Each hook receives a ``register`` callback; the keyword arguments
each callback accepts are documented on the hook. ``docs/plugin-authors.md`` repeats these signatures and a test
checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("ember")
hookimpl = pluggy.HookimplMarker("ember")

#: Version of the backend contract (:class:`ember.backend.Backend`) that this core implements.
CONTRACT_VERSION = 1


@hookspec
def register_backends(register: Callable[..., None]) -> None:
    """Register device backends.

    ``register(name, factory, *, contract, kind="cpu", priority=0, is_available=None, description="")``

    - ``name``: the device kind users write (``Device("mine", 0)``, ``"mine:0"``; ``Device.flex()`` is ``"flex"``).
    - ``factory(index: int, **options) -> ember.backend.Backend``: builds the backend for one device index.
    - ``contract``: the backend-contract version the plugin implements (must equal ``CONTRACT_VERSION``).
    - ``kind``: ``"cpu"``, ``"gpu"`` or ``"emulated"`` (e.g. a CPU OpenCL); ``Device.default()`` prefers
      real hardware ("gpu") over "cpu" over "emulated".
    - ``priority``: tie-breaker within a kind; higher wins.
    - ``is_available() -> int``: number of devices present (0 = hardware missing); ``None`` means 1.
    - ``device_kind(index) -> str``: the kind of one device when devices differ (an OpenCL CPU runtime ranks as
      "cpu"); ``None`` means every device is of ``kind`` (keyword ``device_kind=None``).
    - ``install_hint``: what to install when no device is found (a driver, a runtime), shown by
      ``Device.<name>(i)`` (keyword ``install_hint=""``).
    - ``host``: the backend's memory is the host's: ``from_numpy`` adopts a C-contiguous array without copying and
      ``to_numpy`` returns the handle's own memory (keyword ``host=False``). The host device, ``Device.host()``,
      is the installed ``host=True`` backend of highest ``priority``; ``.cpu()``, ``ember.from_numpy``,
      ``records.load_into`` and the device string ``"cpu"`` use it, so core never names a backend.
    - ``positional``: option names that positional arguments of ``Device.<name>(...)`` fill instead of the index
      (keyword ``positional=()``): a remote backend with ``positional=("address",)`` makes
      ``Device.remote("ember://host:7433/flex")`` mean ``Device.remote(address=...)``.

    Backend names appear in device strings: lowercase letters, digits, ``_`` and ``-``, starting with a letter.
    """


@hookspec
def register_decorators(register: Callable[..., None]) -> None:
    """Register backend decorators (autodiff, fusion, router, ...).

    ``register(name, factory, *, contract, description="", automatic=False, enabled=None, applies_to=None, differentiable=False, positional=())``

    ``factory(inner: ember.backend.Backend, **options) -> ember.backend.Backend`` wraps an inner backend.
    Once registered, ``device.<name>(**options)`` returns the decorated device (``device.autodiff()``). ``name``
    must be a public identifier that is not already a ``Device`` attribute (``sync``, ``seed``, ``inner``, ...).

    An ``automatic`` decorator (fusion) applies to every device without being named, innermost, directly over the
    backend; its factory may return ``inner`` unchanged where it does not apply. ``device.<name>(False)`` opts
    a device out (the factory is then not called) and ``device.<name>(**options)`` sets its options.
    ``enabled() -> bool`` says whether it is on by default right now (fusion reads ``EMBER_FUSION``); when it
    is off, devices print as opted out (``flex+fusion(enabled=False)``) so labels say what runs.
    ``applies_to(backend) -> bool`` says whether it wraps a given backend on a device that does not name it
    (fusion declines a backend whose ``fuse_by_default`` is False: flex); a device that names it
    (``device.fusion()``) gets it anyway.

    ``positional`` names the options that positional arguments fill, in order: ``dev.router("local")`` and the
    device string ``flex+router(local)`` are ``router(channel="local")``.

    ``differentiable=True`` declares that the decorated stack records gradients (it implements
    :class:`ember.decorator.Differentiable`): core names it in hints for the gradient API, and the conformance kit
    uses it to test gradients, without knowing its name.
    """


@hookspec
def register_ops(register: Callable[..., None]) -> None:
    """Register extension ops (custom kernels) into the dispatch tables.

    ``register(name, default, *, backends=None, description="", fusable=False)``

    ``default(backend, *args, **kwargs)`` is the composition used on every backend; ``backends`` maps a backend
    name to a faster implementation with the same signature. On a fused device a backend's own implementation is
    a fusion boundary (its inputs are computed first); ``fusable=True`` declares that the default composition
    should be used there instead, so its ops are recorded and fused with their neighbours.
    Call registered ops with ``ember.dispatch.call(name, ...)``. The ops join the registry of
    :func:`ember.backend_extension` (the newer way to declare an op, with a shape rule and a vjp) and take the
    same path through :mod:`ember.dispatch`.
    """


@hookspec
def register_backend_traits(register: Callable[..., None]) -> None:
    """Declare how a backend takes part in ember's process-wide settings: autocast, thread counts, determinism.

    Call ``register`` once per backend the plugin registers (all keywords optional):

    ``register(backend, *, autocast_dtype=None, autocast_ops=None, set_num_threads=None, nondeterministic_ops=None)``

    - ``backend``: the backend name given to ``register_backends``.
    - ``autocast_dtype``: the lower-precision dtype (``ember.bfloat16`` or ``ember.float16``) that
      ``ember.autocast`` uses on this backend when no dtype is given; ``None``: float16 where the backend's kind is
      ``"gpu"``, else bfloat16 (PyTorch's CUDA and CPU defaults).
    - ``autocast_ops``: ``"cpu"`` or ``"gpu"``: which of PyTorch's autocast op lists (``torch.autocast("cpu")``'s
      or ``"cuda"``'s) apply on this backend; ``None`` follows the backend's kind the same way.
    - ``set_num_threads``: ``f(n: int) -> None`` that limits the backend's intra-op thread pools to ``n`` threads
      (``ember.set_num_threads``); ``None``: the backend has no pool ember can size, and the setting is recorded.
    - ``nondeterministic_ops``: ``{op: why}``, the backend methods whose results may differ between runs with the
      same input (atomics); the backend calls :func:`ember.runtime.alert_not_deterministic` when it runs one, which
      raises or warns under ``ember.use_deterministic_algorithms(True)``.
    """


@hookspec
def register_namespaces(register: Callable[..., None]) -> None:
    """Publish a module of the plugin as a namespace of ``ember`` (``ember.distributed``, ``ember.fft``).

    Call it once per namespace: ``register(name, module)``

    - ``name``: a Python identifier, the attribute of ``ember`` users write. It must not be one of core's own
      names, except a core namespace that is open to plugins (``ember.linalg``: core keeps matmul and the
      norms there, a plugin adds the decompositions); there, the plugin's names are looked up after core's.
    - ``module``: the dotted import path of the module to publish, or ``"pkg.mod:attr"`` for one object of it
      (``ember.stft``). It is imported on first use, not while plugins load, so a namespace costs nothing until
      someone touches it.

    Without the plugin, ``ember.<name>`` raises :class:`ember.errors.MissingPluginError` (an ``AttributeError``)
    naming the extra that installs it when the installed ember distribution has one.
    """


@hookspec
def plugin_info() -> dict[str, Any]:
    """Extra facts shown by ``ember info`` (library versions, hardware found, ...)."""
