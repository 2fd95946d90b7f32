"""``ember.fft``: PyTorch's ``torch.fft`` (names, arguments, defaults and results).

Every transform is one of three extension ops (:mod:`ember_signal._ops`): complex-to-complex, real-to-complex
(one-sided) and complex-to-real, with gradients as torch's. ``n``/``s`` crop or zero-pad the input first, ``dim``
picks the dims, ``norm`` is ``"backward"`` (default: no scaling forward, 1/n inverse), ``"forward"`` (1/n forward)
or ``"ortho"`` (1/sqrt(n) both ways).

>>> import ember
>>> x = ember.tensor([1.0, 2.0, 3.0, 4.0])
>>> ember.fft.rfft(x)
tensor([10.+0.j, -2.+2.j, -2.+0.j])
>>> ember.fft.irfft(ember.fft.rfft(x), n=4)
tensor([1., 2., 3., 4.])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import ember
from ember.errors import DimError, DTypeError, ShapeError, ValueRangeError

from . import _opencl, flex_kernels
from ._ops import c2c, c2r, check_dtype, r2c

flex_kernels.register()
_opencl.register()  # the OpenCL FFT (used only on ember-opencl's devices)

__all__ = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn",
           "rfftn", "irfftn", "fftfreq", "rfftfreq", "fftshift", "ifftshift"]

_NORMS = ("backward", "forward", "ortho")
_DUAL = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _tensor(x: Any, op: str) -> ember.Tensor:
    if not isinstance(x, ember.Tensor):
        raise DTypeError(f"fft.{op}: expected a Tensor as input, got {type(x).__name__}")
    return x


def _norm(norm: str | None, op: str) -> str:
    if norm is None:
        return "backward"
    if norm not in _NORMS:
        raise ValueRangeError(f"fft.{op}: Invalid normalization mode: {norm!r} (expected None, 'backward', "
                              "'forward' or 'ortho')")
    return norm


def _dim(d: Any, ndim: int, op: str) -> int:
    if isinstance(d, bool) or not isinstance(d, int):
        raise DTypeError(f"fft.{op}: dim must be an int, got {type(d).__name__} {d!r}")
    if not -ndim <= d < ndim or ndim == 0:
        raise DimError(f"fft.{op}: Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but "
                       f"got {d})")
    return d % ndim


def _size(n: Any, op: str, what: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise DTypeError(f"fft.{op}: {what} must be an int, got {type(n).__name__} {n!r}")
    if n < 1:
        raise ValueRangeError(f"fft.{op}: Invalid number of data points ({n}) specified")
    return n


def _dims_and_sizes(x: ember.Tensor, s: Sequence[int] | None, dim: Any, op: str,
                    default_last: int | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The transformed dims (normalised, distinct) and their sizes, as torch's fftn resolves s and dim."""
    if dim is None:
        dims = tuple(range(x.ndim)) if s is None else tuple(range(x.ndim - len(s), x.ndim))
        if s is not None and len(s) > x.ndim:
            raise ShapeError(f"fft.{op}: Got s={tuple(s)} with more entries than the input has dims ({x.ndim})")
    else:
        raw = (dim,) if isinstance(dim, int) else tuple(dim)
        dims = tuple(_dim(d, x.ndim, op) for d in raw)
    if len(set(dims)) != len(dims):
        raise DimError(f"fft.{op}: dims must be unique, got {dims}")
    if not dims:
        raise DimError(f"fft.{op}: there must be at least one dim to transform (input of shape {tuple(x.shape)})")
    if s is None:
        sizes = [x.shape[d] for d in dims]
        if default_last is not None:
            sizes[-1] = default_last
    else:
        s = tuple(s)
        if len(s) != len(dims):
            raise ShapeError(f"fft.{op}: When given, dim and shape arguments must have the same length (s={s}, "
                             f"dim={dims})")
        sizes = [x.shape[d] if n == -1 else _size(n, op, "s") for n, d in zip(s, dims)]
        if default_last is not None and s[-1] == -1:
            sizes[-1] = default_last
    for n in sizes:
        _size(n, op, "the transform size")
    return dims, tuple(sizes)


def _complex_in(x: ember.Tensor, op: str) -> ember.Tensor:
    x = check_dtype(_tensor(x, op), op)
    return x if x.dtype.is_complex else x.to(x.dtype.to_complex)


def _real_in(x: ember.Tensor, op: str) -> ember.Tensor:
    x = check_dtype(_tensor(x, op), op)
    if x.dtype.is_complex:
        raise DTypeError(f"fft.{op}: expects a real input tensor, but got {x.dtype.name}")
    return x


# -- complex-to-complex -------------------------------------------------------------------------------------------
def _cc(input: ember.Tensor, s: Any, dim: Any, norm: str | None, forward: bool, op: str) -> ember.Tensor:
    x = check_dtype(_tensor(input, op), op)
    dims, sizes = _dims_and_sizes(x, s, dim, op)
    return c2c(x, s=sizes, dims=dims, norm=_norm(norm, op), forward=forward)


def fft(input: ember.Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> ember.Tensor:
    """One-dimensional discrete Fourier transform (``torch.fft.fft``); real input gives a complex result."""
    return _cc(input, None if n is None else (n,), dim, norm, True, "fft")


def ifft(input: ember.Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> ember.Tensor:
    """One-dimensional inverse discrete Fourier transform (``torch.fft.ifft``)."""
    return _cc(input, None if n is None else (n,), dim, norm, False, "ifft")


def fft2(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None) -> ember.Tensor:
    """Two-dimensional discrete Fourier transform (``torch.fft.fft2``)."""
    return _cc(input, s, dim, norm, True, "fft2")


def ifft2(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None) -> ember.Tensor:
    """Two-dimensional inverse discrete Fourier transform (``torch.fft.ifft2``)."""
    return _cc(input, s, dim, norm, False, "ifft2")


def fftn(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
         norm: str | None = None) -> ember.Tensor:
    """N-dimensional discrete Fourier transform (``torch.fft.fftn``); dim None: all dims (the last len(s) with s)."""
    return _cc(input, s, dim, norm, True, "fftn")


def ifftn(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> ember.Tensor:
    """N-dimensional inverse discrete Fourier transform (``torch.fft.ifftn``)."""
    return _cc(input, s, dim, norm, False, "ifftn")


# -- real-to-complex ----------------------------------------------------------------------------------------------
def _rc(input: ember.Tensor, s: Any, dim: Any, norm: str | None, op: str) -> ember.Tensor:
    x = _real_in(input, op)
    dims, sizes = _dims_and_sizes(x, s, dim, op)
    return r2c(x, s=sizes, dims=dims, norm=_norm(norm, op))


def rfft(input: ember.Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> ember.Tensor:
    """FFT of a real signal, the n // 2 + 1 non-negative frequencies (``torch.fft.rfft``)."""
    return _rc(input, None if n is None else (n,), dim, norm, "rfft")


def rfft2(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None) -> ember.Tensor:
    """Two-dimensional FFT of a real input, one-sided in the last dim (``torch.fft.rfft2``)."""
    return _rc(input, s, dim, norm, "rfft2")


def rfftn(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> ember.Tensor:
    """N-dimensional FFT of a real input, one-sided in the last transformed dim (``torch.fft.rfftn``)."""
    return _rc(input, s, dim, norm, "rfftn")


# -- complex-to-real ----------------------------------------------------------------------------------------------
def _cr(input: ember.Tensor, s: Any, dim: Any, norm: str | None, op: str, conj_norm: bool = False) -> ember.Tensor:
    x = _complex_in(input, op)
    probe_dims, _ = _dims_and_sizes(x, None if s is None else tuple(-1 for _ in s), dim, op)
    last = 2 * (x.shape[probe_dims[-1]] - 1)  # torch's default output length of the last dim
    if s is None or tuple(s)[-1] == -1:
        if last < 1:
            raise ValueRangeError(f"fft.{op}: Invalid number of data points ({last}) specified (input of shape "
                                  f"{tuple(x.shape)}: give n/s)")
    dims, sizes = _dims_and_sizes(x, s, dim, op, default_last=last if (s is None or tuple(s)[-1] == -1) else None)
    nm = _norm(norm, op)
    return c2r(x, s=sizes, dims=dims, norm=_DUAL[nm] if conj_norm else nm)


def irfft(input: ember.Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> ember.Tensor:
    """Inverse of rfft: a real signal of n points (default 2 * (m - 1)) (``torch.fft.irfft``)."""
    return _cr(input, None if n is None else (n,), dim, norm, "irfft")


def irfft2(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
           norm: str | None = None) -> ember.Tensor:
    """Inverse of rfft2 (``torch.fft.irfft2``)."""
    return _cr(input, s, dim, norm, "irfft2")


def irfftn(input: ember.Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
           norm: str | None = None) -> ember.Tensor:
    """Inverse of rfftn (``torch.fft.irfftn``)."""
    return _cr(input, s, dim, norm, "irfftn")


def hfft(input: ember.Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> ember.Tensor:
    """FFT of a Hermitian-symmetric signal given by its first half: a real spectrum of n points
    (``torch.fft.hfft``; irfft of the conjugate with the dual norm)."""
    x = _complex_in(input, "hfft")
    return _cr(ember.conj(x), None if n is None else (n,), dim, norm, "hfft", conj_norm=True)


def ihfft(input: ember.Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> ember.Tensor:
    """Inverse of hfft: the n // 2 + 1 first bins of the inverse FFT of a real signal (``torch.fft.ihfft``)."""
    x = _real_in(input, "ihfft")
    dims, sizes = _dims_and_sizes(x, None if n is None else (n,), dim, "ihfft")
    return ember.conj(r2c(x, s=sizes, dims=dims, norm=_DUAL[_norm(norm, "ihfft")]))


# -- helpers ------------------------------------------------------------------------------------------------------
def _freq_dtype(dtype: Any) -> Any:
    d = ember.get_default_dtype() if dtype is None else ember.dtypes.as_dtype(dtype)
    if not d.is_floating_point:
        raise DTypeError(f"fftfreq: dtype must be a floating dtype, got {d.name}")
    return d


def fftfreq(n: int, d: float = 1.0, *, dtype: Any = None, device: Any = None,
            requires_grad: bool = False) -> ember.Tensor:
    """The sample frequencies of an n-point FFT with sample spacing d: [0, 1, ..., -1] / (d * n)
    (``torch.fft.fftfreq``)."""
    n = _size(n, "fftfreq")
    k = np.concatenate([np.arange(0, (n - 1) // 2 + 1), np.arange(-(n // 2), 0)]).astype(np.float64)
    t = ember.tensor(k / (d * n), dtype=_freq_dtype(dtype), device=device)
    return t.requires_grad_() if requires_grad else t


def rfftfreq(n: int, d: float = 1.0, *, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> ember.Tensor:
    """The n // 2 + 1 non-negative sample frequencies of an n-point rfft (``torch.fft.rfftfreq``)."""
    n = _size(n, "rfftfreq")
    t = ember.tensor(np.arange(0, n // 2 + 1, dtype=np.float64) / (d * n), dtype=_freq_dtype(dtype), device=device)
    return t.requires_grad_() if requires_grad else t


def _shift(input: ember.Tensor, dim: Any, op: str, inverse: bool) -> ember.Tensor:
    x = _tensor(input, op)
    if dim is None:
        dims: tuple[int, ...] = tuple(range(x.ndim))
    else:
        raw = (dim,) if isinstance(dim, int) else tuple(dim)
        dims = tuple(_dim(d, x.ndim, op) for d in raw)
    if not dims:
        return x
    shifts = tuple(-(x.shape[d] // 2) if inverse else x.shape[d] // 2 for d in dims)
    return ember.roll(x, shifts, dims)


def fftshift(input: ember.Tensor, dim: int | Sequence[int] | None = None) -> ember.Tensor:
    """Move the zero-frequency term to the centre (``torch.fft.fftshift``; dim None: every dim)."""
    return _shift(input, dim, "fftshift", False)


def ifftshift(input: ember.Tensor, dim: int | Sequence[int] | None = None) -> ember.Tensor:
    """The inverse of fftshift (``torch.fft.ifftshift``)."""
    return _shift(input, dim, "ifftshift", True)


