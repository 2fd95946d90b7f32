"""Complex tensors: ``real``, ``imag``, ``abs``, ``angle``, ``conj``, ``view_as_real``, ``view_as_complex``,
``polar`` and ``complex`` (PyTorch's names and semantics).

The ops that cross between complex and real dtypes are extension ops (``ember.backend_extension``, unpublished):
a backend that stores complex numbers gives each a kernel (ember-flex does: numpy's ``real``, ``imag``, ``abs``...);
without one the default composition runs through host memory. Each has a vjp in PyTorch's convention for complex
gradients (the conjugate Wirtinger derivative times two: for a real loss L of z = a + ib the gradient is
dL/da + i dL/db), so ``ember.fft.rfft(x).abs().sum().backward()`` gives torch's gradient on a differentiable device.

ember keeps no lazy conjugate bit: ``conj`` materializes (it is ``conj_physical``) and ``is_conj`` is always False;
``real``/``imag``/``view_as_real`` return new tensors where PyTorch returns views (writes do not reach the input).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import DTypeError, ShapeError
from ..extension import TensorSpec, backend_extension
from ..tensor import Tensor

__all__ = ["is_complex", "real", "imag", "angle", "conj", "conj_physical", "resolve_conj", "is_conj",
           "view_as_real", "view_as_complex", "polar", "complex", "complex64", "complex128",
           "cfloat", "cdouble", "get_default_complex_dtype"]

complex64 = dt.complex64
complex128 = dt.complex128
cfloat = dt.complex64
cdouble = dt.complex128
get_default_complex_dtype = dt.get_default_complex_dtype


def _tensor(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x


def _on_host(x: Tensor, fn: Callable[[np.ndarray], np.ndarray], dtype: DType) -> Tensor:
    """The default composition of the ops below: ``fn`` on the host copy, the result back on x's device (for a
    backend that stores complex numbers but registered no kernel)."""
    arr = np.ascontiguousarray(np.asarray(fn(x.numpy())), dtype=dtype.numpy)
    return Tensor._make(x._device.stack.from_numpy(arr), dtype, x._device)


def _need_complex(spec: TensorSpec, op: str) -> None:
    if not spec.dtype.is_complex:
        raise DTypeError(f"{op}: expected a complex tensor, got dtype {spec.dtype.name}")


def _real_spec(x: TensorSpec) -> TensorSpec:
    _need_complex(x, "real")
    return TensorSpec(x.shape, x.dtype.to_real)


# -- real / imag / abs / angle: complex in, real out ----------------------------------------------------------
@backend_extension("complex.real", output=_real_spec, publish=False)
def _real(x: Tensor) -> Tensor:
    """The real part of a complex tensor."""
    return _on_host(x, np.real, x.dtype.to_real)


@_real.vjp
def _(ctx: Any, g: Tensor) -> tuple[Tensor]:
    return (complex(g, g.new_zeros(())),)


@backend_extension("complex.imag", output=_real_spec, publish=False)
def _imag(x: Tensor) -> Tensor:
    """The imaginary part of a complex tensor."""
    return _on_host(x, np.imag, x.dtype.to_real)


@_imag.vjp
def _(ctx: Any, g: Tensor) -> tuple[Tensor]:
    return (complex(g.new_zeros(()), g),)


@backend_extension("complex.abs", output=_real_spec, publish=False)
def _abs(x: Tensor) -> Tensor:
    """|z| of a complex tensor (a real tensor)."""
    return _on_host(x, np.abs, x.dtype.to_real)


@_abs.vjp(outputs=(0,))
def _(ctx: Any, g: Tensor) -> tuple[Tensor]:
    (z,), (r,) = ctx.inputs, ctx.outputs
    # PyTorch: g * sgn(z), sgn(z) = z / |z| and 0 at 0
    safe = r + (r == 0).to(r.dtype)
    return ((g / safe) * z,)


@backend_extension("complex.angle", output=_real_spec, publish=False)
def _angle(x: Tensor) -> Tensor:
    """The argument (phase) of a complex tensor, in (-pi, pi]."""
    return _on_host(x, np.angle, x.dtype.to_real)


@_angle.vjp
def _(ctx: Any, g: Tensor) -> tuple[Tensor]:
    (z,) = ctx.inputs
    # angle = atan2(b, a): dL/da + i dL/db = g * (-b + i a) / |z|^2 = g * i z / |z|^2 (0 where z is 0)
    r2 = _real(z * conj(z))
    safe = r2 + (r2 == 0).to(r2.dtype)
    return (complex(g.new_zeros(()), g / safe) * z,)


# -- conj: complex in, complex out ------------------------------------------------------------------------------
@backend_extension("complex.conj", output=lambda x: TensorSpec(x.shape, x.dtype), publish=False)
def _conj(x: Tensor) -> Tensor:
    """The complex conjugate, materialized."""
    return _on_host(x, np.conj, x.dtype)


@_conj.vjp
def _(ctx: Any, g: Tensor) -> tuple[Tensor]:
    return (_conj(g),)


# -- view_as_real / view_as_complex / complex / polar ---------------------------------------------------------
def _as_real_spec(x: TensorSpec) -> TensorSpec:
    _need_complex(x, "view_as_real")
    return TensorSpec((*x.shape, 2), x.dtype.to_real)


@backend_extension("complex.view_as_real", output=_as_real_spec, publish=False)
def _view_as_real(x: Tensor) -> Tensor:
    """A complex tensor of shape s as a real one of shape (*s, 2): (real, imag) pairs."""
    return _on_host(x, lambda a: np.stack([a.real, a.imag], axis=-1), x.dtype.to_real)


@_view_as_real.vjp
def _(ctx: Any, g: Tensor) -> tuple[Tensor]:
    return (_view_as_complex(g),)


def _as_complex_spec(x: TensorSpec) -> TensorSpec:
    if x.dtype not in (dt.float32, dt.float64):
        raise DTypeError(f"view_as_complex: expected a float32 or float64 tensor, got {x.dtype.name}")
    if not x.shape or x.shape[-1] != 2:
        raise ShapeError(f"view_as_complex: the last dimension must have size 2 (real, imag), got shape {x.shape}")
    return TensorSpec(x.shape[:-1], x.dtype.to_complex)


@backend_extension("complex.view_as_complex", output=_as_complex_spec, publish=False)
def _view_as_complex(x: Tensor) -> Tensor:
    """A real tensor of shape (*s, 2) as a complex one of shape s."""
    return _on_host(x, lambda a: a[..., 0] + 1j * a[..., 1], x.dtype.to_complex)


@_view_as_complex.vjp
def _(ctx: Any, g: Tensor) -> tuple[Tensor]:
    return (_view_as_real(g),)


def _pair_spec(a: TensorSpec, b: TensorSpec, op: str) -> TensorSpec:
    if a.dtype is not b.dtype or a.dtype not in (dt.float32, dt.float64):
        raise DTypeError(f"{op}: expected two float32 or two float64 tensors, got {a.dtype.name} and {b.dtype.name}")
    from ..shapes import broadcast_shapes

    return TensorSpec(broadcast_shapes(a.shape, b.shape, op=op), a.dtype.to_complex)


@backend_extension("complex.complex", output=lambda a, b: _pair_spec(a, b, "complex"), publish=False)
def _complex(re: Tensor, im: Tensor) -> Tensor:
    """real + i * imag (broadcast)."""
    a, b = np.broadcast_arrays(re.numpy(), im.numpy())
    arr = np.ascontiguousarray(a + 1j * b, dtype=re.dtype.to_complex.numpy)
    return Tensor._make(re._device.stack.from_numpy(arr), re.dtype.to_complex, re._device)


@_complex.vjp
def _(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
    return (_real(g), _imag(g))


@backend_extension("complex.polar", output=lambda a, b: _pair_spec(a, b, "polar"), publish=False)
def _polar(r: Tensor, theta: Tensor) -> Tensor:
    """r * (cos(theta) + i sin(theta)) (broadcast)."""
    a, b = np.broadcast_arrays(r.numpy(), theta.numpy())
    arr = np.ascontiguousarray(a * np.cos(b) + 1j * (a * np.sin(b)), dtype=r.dtype.to_complex.numpy)
    return Tensor._make(r._device.stack.from_numpy(arr), r.dtype.to_complex, r._device)


@_polar.vjp(outputs=(0,))
def _(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
    (_, theta), (z,) = ctx.inputs, ctx.outputs
    # for a real input x: dL/dx = Re(conj(g) * dz/dx); dz/dr = e^{i theta}, dz/dtheta = i z
    e = _complex(theta.cos(), theta.sin())
    gc = _conj(g)
    return (_real(gc * e), _real(gc * z * 1j))


# -- the public functions -------------------------------------------------------------------------------------
def is_complex(input: Tensor) -> bool:
    """True if input's dtype is complex (``torch.is_complex``)."""
    return _tensor(input, "is_complex")._dtype.is_complex


def real(input: Tensor) -> Tensor:
    """The real part (``torch.real``); a real tensor is returned as is."""
    x = _tensor(input, "real")
    return _real(x) if x._dtype.is_complex else x


def imag(input: Tensor) -> Tensor:
    """The imaginary part (``torch.imag``); a real tensor raises DTypeError, as in PyTorch."""
    x = _tensor(input, "imag")
    if not x._dtype.is_complex:
        raise DTypeError(f"imag: not implemented for real tensors (dtype {x._dtype.name}); imag needs a complex "
                         "tensor")
    return _imag(x)


def abs_complex(input: Tensor) -> Tensor:
    """|z| of a complex tensor, a real tensor of the component dtype (what ``ember.abs`` runs on complex)."""
    return _abs(_tensor(input, "abs"))


def angle(input: Tensor) -> Tensor:
    """The argument in radians (``torch.angle``): atan2(imag, real) for complex input; pi for negative reals, 0
    otherwise (NaN stays NaN) for real input, in the default float dtype for integers."""
    x = _tensor(input, "angle")
    if x._dtype.is_complex:
        return _angle(x)
    if not x._dtype.is_floating_point:
        x = x.to(x._device.default_dtype)
    from .pointwise import where

    return where(x < 0, math.pi, 0.0).to(x._dtype) + x * 0  # x * 0 keeps NaN (and its gradient zero)


def conj_physical(input: Tensor) -> Tensor:
    """The complex conjugate, as a new tensor (``torch.conj_physical``); a real tensor is returned as is."""
    x = _tensor(input, "conj_physical")
    return _conj(x) if x._dtype.is_complex else x


def conj(input: Tensor) -> Tensor:
    """The complex conjugate (``torch.conj``). ember keeps no lazy conjugate bit: the result is materialized."""
    return conj_physical(input)


def resolve_conj(input: Tensor) -> Tensor:
    """``torch.resolve_conj``: ember's conjugates are always materialized, so input itself."""
    return _tensor(input, "resolve_conj")


def is_conj(input: Tensor) -> bool:
    """``torch.is_conj``: always False (ember materializes conjugates)."""
    _tensor(input, "is_conj")
    return False


def view_as_real(input: Tensor) -> Tensor:
    """A complex tensor of shape s as a real tensor of shape (*s, 2) (``torch.view_as_real``; a copy in ember)."""
    x = _tensor(input, "view_as_real")
    if not x._dtype.is_complex:
        raise DTypeError(f"view_as_real: only complex tensors are supported, got dtype {x._dtype.name}")
    return _view_as_real(x)


def view_as_complex(input: Tensor) -> Tensor:
    """A float32/float64 tensor of shape (*s, 2) as a complex tensor of shape s (``torch.view_as_complex``)."""
    return _view_as_complex(_tensor(input, "view_as_complex"))


def complex(real: Tensor, imag: Tensor) -> Tensor:  # noqa: A001 - torch.complex
    """real + i * imag from two float32 or two float64 tensors of one dtype (``torch.complex``), broadcast."""
    _tensor(real, "complex")
    _tensor(imag, "complex")
    return _complex(real, imag)


def polar(abs: Tensor, angle: Tensor) -> Tensor:  # noqa: A002 - torch's argument names
    """abs * (cos(angle) + i sin(angle)) (``torch.polar``)."""
    _tensor(abs, "polar")
    _tensor(angle, "polar")
    return _polar(abs, angle)


def _real_prop(self: Tensor) -> Tensor:
    """The real part (``Tensor.real``); a real tensor itself."""
    return real(self)


def _imag_prop(self: Tensor) -> Tensor:
    """The imaginary part (``Tensor.imag``); real tensors raise DTypeError."""
    return imag(self)


TENSOR_METHODS: dict[str, Any] = {
    "real": property(_real_prop),
    "imag": property(_imag_prop),
    "is_complex": is_complex,
    "angle": angle,
    "conj": conj,
    "conj_physical": conj_physical,
    "resolve_conj": resolve_conj,
    "is_conj": is_conj,
}

#: the host kernels a numpy-backed backend registers (ember-flex does): op -> fn(backend, *handles)
HOST_KERNELS: dict[Any, Callable[..., Any]] = {
    _real: lambda be, h: np.ascontiguousarray(h.real),
    _imag: lambda be, h: np.ascontiguousarray(h.imag),
    _abs: lambda be, h: np.asarray(np.abs(h)),
    _angle: lambda be, h: np.asarray(np.angle(h)),
    _conj: lambda be, h: np.asarray(np.conj(h)),
    _view_as_real: lambda be, h: np.ascontiguousarray(h).view(h.real.dtype).reshape(*h.shape, 2),
    _view_as_complex: lambda be, h: np.ascontiguousarray(h).view(np.result_type(h.dtype, np.complex64)
                                                                 ).reshape(h.shape[:-1]),
    _complex: lambda be, a, b: np.asarray(a + 1j * b).astype(np.result_type(a.dtype, np.complex64), copy=False),
    _polar: lambda be, a, b: np.asarray(a * np.cos(b) + 1j * (a * np.sin(b))).astype(
        np.result_type(a.dtype, np.complex64), copy=False),
}
