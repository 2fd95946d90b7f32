"""ember: a tensor library and deep-learning framework whose device, chosen at run time, decides everything.

>>> import ember
>>> x = ember.tensor([[1.0, 2.0], [3.0, 4.0]])
>>> (x @ x).sum().item()
54.0

Backends, decorators and extensions are plugins found through the ``ember`` entry-point group the first time a
device is used; ``import ember`` itself loads no backend.
"""

from __future__ import annotations

from typing import Any

from . import autograd, dtypes
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .device import Device, default_device, set_default_device
from .dtypes import (
    DType,
    bfloat16,
    bool_,
    double,
    float16,
    float32,
    float64,
    get_default_dtype,
    half,
    int8,
    int16,
    int32,
    int64,
    long,
    promote_types,
    result_type,
    set_default_dtype,
    short,
    uint8,
)
from .dtypes import can_cast as _can_cast
from .errors import (
    AutodiffError,
    DeviceError,
    DimError,
    DTypeError,
    EmberError,
    IndexOutOfRangeError,
    OutOfMemoryError,
    PluginError,
    ShapeError,
    UnsupportedError,
    ValueRangeError,
)
from .extension import TensorSpec, backend_extension
from .generator import Generator
from .shapes import Size
from .tensor import Tensor

__version__ = "0.1.0"

float = float32  # noqa: A001 - torch.float
int = int32  # noqa: A001 - torch.int
bool = bool_  # noqa: A001 - torch.bool

can_cast = _can_cast


def _install() -> dict[str, Any]:
    """Collect the public functions of the op modules and attach their Tensor methods."""
    from importlib import import_module

    from .tensor import install_methods

    names: dict[str, Any] = {}
    for mod_name in ("creation", "pointwise", "reduction", "shape", "indexing", "linalg", "conversion", "random",
                     "distributions", "complex"):
        mod = import_module(f".ops.{mod_name}", __name__)
        for n in getattr(mod, "__all__", ()):
            names[n] = getattr(mod, n)
        install_methods(getattr(mod, "TENSOR_METHODS", {}))
    return names


globals().update(_install())

# torch.autocast / torch.amp, and the process-wide settings (threads, deterministic algorithms)
from . import amp  # noqa: E402 - the op modules above already loaded it (their autocast entry points)
from .amp import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: E402
from .runtime import (  # noqa: E402
    are_deterministic_algorithms_enabled,
    get_num_interop_threads,
    get_num_threads,
    is_deterministic_algorithms_warn_only_enabled,
    set_num_interop_threads,
    set_num_threads,
    use_deterministic_algorithms,
)


def info() -> dict[str, Any]:
    """Plugins, versions, contract versions, devices found and load errors (what ``ember info`` prints)."""
    from ._info import collect

    return collect()


#: subpackages that cost import time load on first use
LAZY_SUBMODULES = frozenset({"nn", "testing", "linalg", "plugins", "backend", "dispatch", "extension", "records",
                             "optim", "utils", "cuda", "quantization", "save", "load",
                             "capture", "compile"})  # callable modules: ember.capture(fn, x), ember.compile(fn)


def __getattr__(name: str) -> Any:
    if name in ("save", "load"):  # torch.save/torch.load; safetensors-based, loaded on first use
        from . import serialization

        return getattr(serialization, name)
    if name in LAZY_SUBMODULES:
        from importlib import import_module

        return import_module(f".{name}", __name__)
    # what plugins publish (ember.fft, ember.distributed, ...): looked up among the loaded plugins
    from .plugins.namespaces import resolve_top_level

    return resolve_top_level(name)
