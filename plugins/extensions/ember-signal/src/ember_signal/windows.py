"""Window functions, under PyTorch's two spellings:

* ``ember.signal.windows.hann(M, *, sym=True, ...)`` & co. (``torch.signal.windows``: symmetric by default, the
  filter-design convention, as scipy.signal.windows);
* ``ember.hann_window(window_length, periodic=True, ...)`` & co. (``torch.hann_window``: periodic by default, the
  spectral-analysis convention stft and the spectrogram modules use).

A periodic window of length M is the symmetric window of length M + 1 without its last point. Values are computed
in float64 on the host and returned in ``dtype`` (default: the default float dtype) on ``device``.

>>> import ember
>>> ember.hann_window(4)
tensor([0. , 0.5, 1. , 0.5])
>>> ember.signal.windows.hann(5)
tensor([0. , 0.5, 1. , 0.5, 0. ])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ember
from ember.errors import DTypeError, ValueRangeError

__all__ = ["hann", "hamming", "blackman", "bartlett", "kaiser", "cosine", "gaussian", "exponential", "general_cosine",
           "general_hamming", "nuttall", "hann_window", "hamming_window", "blackman_window",
           "bartlett_window", "kaiser_window"]


def _make(op: str, m: Any, sym: bool, fn: Callable[[np.ndarray, int], np.ndarray], dtype: Any, device: Any,
          requires_grad: bool) -> ember.Tensor:
    """fn(n, L) over n = 0..L-1 for the symmetric window of length L = M (sym) or M + 1 (periodic, last dropped)."""
    if isinstance(m, bool) or not isinstance(m, int):
        raise DTypeError(f"{op}: the window length must be an int, got {type(m).__name__} {m!r}")
    if m < 0:
        raise ValueRangeError(f"{op}: requires non-negative window length, got window_length={m}")
    d = ember.get_default_dtype() if dtype is None else ember.dtypes.as_dtype(dtype)
    if not d.is_floating_point:
        raise DTypeError(f"{op}: expected a floating point dtype, got {d.name}")
    if m <= 1:
        vals = np.ones(m, dtype=np.float64)
    else:
        length = m if sym else m + 1
        vals = fn(np.arange(length, dtype=np.float64), length)[:m]
    t = ember.tensor(vals, dtype=d, device=device)
    return t.requires_grad_() if requires_grad else t


def _cosine_sum(coeffs: tuple[float, ...]) -> Callable[[np.ndarray, int], np.ndarray]:
    def f(n: np.ndarray, length: int) -> np.ndarray:
        out = np.zeros_like(n)
        for k, a in enumerate(coeffs):
            out += (-1) ** k * a * np.cos(2 * np.pi * k * n / (length - 1))
        return out

    return f


def _bartlett(n: np.ndarray, length: int) -> np.ndarray:
    return 1 - np.abs(2 * n / (length - 1) - 1)


def _kaiser(beta: float) -> Callable[[np.ndarray, int], np.ndarray]:
    def f(n: np.ndarray, length: int) -> np.ndarray:
        half = (length - 1) / 2
        return np.i0(beta * np.sqrt(np.clip(1 - ((n - half) / half) ** 2, 0, None))) / np.i0(beta)

    return f


# -- torch.signal.windows (symmetric by default) ------------------------------------------------------------------
def hann(M: int, *, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803 - torch's name
         requires_grad: bool = False) -> ember.Tensor:
    """Hann window, 0.5 - 0.5 cos(2 pi n / (M - 1)) (``torch.signal.windows.hann``; sym=False: periodic)."""
    return _make("signal.windows.hann", M, sym, _cosine_sum((0.5, 0.5)), dtype, device, requires_grad)


def hamming(M: int, *, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803
            requires_grad: bool = False) -> ember.Tensor:
    """Hamming window, 0.54 - 0.46 cos(2 pi n / (M - 1)) (``torch.signal.windows.hamming``)."""
    return _make("signal.windows.hamming", M, sym, _cosine_sum((0.54, 0.46)), dtype, device, requires_grad)


def blackman(M: int, *, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803
             requires_grad: bool = False) -> ember.Tensor:
    """Blackman window, 0.42 - 0.5 cos(2 pi n / (M - 1)) + 0.08 cos(4 pi n / (M - 1))
    (``torch.signal.windows.blackman``)."""
    return _make("signal.windows.blackman", M, sym, _cosine_sum((0.42, 0.5, 0.08)), dtype, device, requires_grad)


def bartlett(M: int, *, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803
             requires_grad: bool = False) -> ember.Tensor:
    """Bartlett (triangular) window, 1 - abs(2n / (M - 1) - 1) (``torch.signal.windows.bartlett``)."""
    return _make("signal.windows.bartlett", M, sym, _bartlett, dtype, device, requires_grad)


def kaiser(M: int, *, beta: float = 12.0, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803
           requires_grad: bool = False) -> ember.Tensor:
    """Kaiser window, I0(beta sqrt(1 - (2n / (M - 1) - 1)^2)) / I0(beta) (``torch.signal.windows.kaiser``)."""
    if beta < 0:
        raise ValueRangeError(f"signal.windows.kaiser: beta must be non-negative, got {beta}")
    return _make("signal.windows.kaiser", M, sym, _kaiser(float(beta)), dtype, device, requires_grad)


def cosine(M: int, *, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803
           requires_grad: bool = False) -> ember.Tensor:
    """Cosine (sine) window, sin(pi (n + 0.5) / M) (``torch.signal.windows.cosine``)."""
    return _make("signal.windows.cosine", M, sym, lambda n, length: np.sin(np.pi * (n + 0.5) / length), dtype,
                 device, requires_grad)


def gaussian(M: int, *, std: float = 1.0, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803
             requires_grad: bool = False) -> ember.Tensor:
    """Gaussian window, exp(-((n - (M - 1) / 2) / std)^2 / 2) (``torch.signal.windows.gaussian``)."""
    if std <= 0:
        raise ValueRangeError(f"signal.windows.gaussian: standard deviation must be positive, got {std}")
    return _make("signal.windows.gaussian", M, sym,
                 lambda n, length: np.exp(-0.5 * ((n - (length - 1) / 2) / std) ** 2), dtype, device, requires_grad)


def exponential(M: int, *, center: float | None = None, tau: float = 1.0, sym: bool = True,  # noqa: N803
                dtype: Any = None, device: Any = None, requires_grad: bool = False) -> ember.Tensor:
    """Exponential (Poisson) window, exp(-abs(n - center) / tau), centre (M - 1) / 2 by default
    (``torch.signal.windows.exponential``; a centre needs ``sym=False``)."""
    if tau <= 0:
        raise ValueRangeError(f"signal.windows.exponential: Tau must be positive, got: {tau} instead.")
    if sym and center is not None:
        raise ValueRangeError("signal.windows.exponential: Center must be None for symmetric windows")

    def f(n: np.ndarray, length: int) -> np.ndarray:
        c = (length - 1) / 2 if center is None else center
        return np.exp(-np.abs(n - c) / tau)

    return _make("signal.windows.exponential", M, sym, f, dtype, device, requires_grad)


def general_cosine(M: int, *, a: Sequence[float], sym: bool = True, dtype: Any = None,  # noqa: N803
                   device: Any = None, requires_grad: bool = False) -> ember.Tensor:
    """Sum of cosines, sum_k (-1)^k a_k cos(2 pi k n / (M - 1)) (``torch.signal.windows.general_cosine``)."""
    if not isinstance(a, Sequence) or not a:
        raise DTypeError(f"signal.windows.general_cosine: a must be a non-empty sequence of numbers, got {a!r}")
    return _make("signal.windows.general_cosine", M, sym, _cosine_sum(tuple(float(v) for v in a)), dtype, device,
                 requires_grad)


def general_hamming(M: int, *, alpha: float = 0.54, sym: bool = True, dtype: Any = None,  # noqa: N803
                    device: Any = None, requires_grad: bool = False) -> ember.Tensor:
    """Generalized Hamming window, alpha - (1 - alpha) cos(2 pi n / (M - 1))
    (``torch.signal.windows.general_hamming``)."""
    return _make("signal.windows.general_hamming", M, sym, _cosine_sum((alpha, 1.0 - alpha)), dtype, device,
                 requires_grad)


def nuttall(M: int, *, sym: bool = True, dtype: Any = None, device: Any = None,  # noqa: N803
            requires_grad: bool = False) -> ember.Tensor:
    """Minimum 4-term Blackman-Harris window (Nuttall's) (``torch.signal.windows.nuttall``)."""
    return _make("signal.windows.nuttall", M, sym, _cosine_sum((0.3635819, 0.4891775, 0.1365995, 0.0106411)), dtype,
                 device, requires_grad)


# -- torch.*_window (periodic by default) -------------------------------------------------------------------------
def hann_window(window_length: int, periodic: bool = True, *, dtype: Any = None, device: Any = None,
                requires_grad: bool = False) -> ember.Tensor:
    """Hann window (``torch.hann_window``): periodic by default, as stft wants."""
    return _make("hann_window", window_length, not periodic, _cosine_sum((0.5, 0.5)), dtype, device, requires_grad)


def hamming_window(window_length: int, periodic: bool = True, alpha: float = 0.54, beta: float = 0.46, *,
                   dtype: Any = None, device: Any = None, requires_grad: bool = False) -> ember.Tensor:
    """Hamming window alpha - beta cos(2 pi n / N) (``torch.hamming_window``)."""
    return _make("hamming_window", window_length, not periodic, _cosine_sum((alpha, beta)), dtype, device,
                 requires_grad)


def blackman_window(window_length: int, periodic: bool = True, *, dtype: Any = None, device: Any = None,
                    requires_grad: bool = False) -> ember.Tensor:
    """Blackman window (``torch.blackman_window``)."""
    return _make("blackman_window", window_length, not periodic, _cosine_sum((0.42, 0.5, 0.08)), dtype, device,
                 requires_grad)


def bartlett_window(window_length: int, periodic: bool = True, *, dtype: Any = None, device: Any = None,
                    requires_grad: bool = False) -> ember.Tensor:
    """Bartlett window (``torch.bartlett_window``)."""
    return _make("bartlett_window", window_length, not periodic, _bartlett, dtype, device, requires_grad)


def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype: Any = None,
                  device: Any = None, requires_grad: bool = False) -> ember.Tensor:
    """Kaiser window (``torch.kaiser_window``)."""
    return _make("kaiser_window", window_length, not periodic, _kaiser(float(beta)), dtype, device, requires_grad)
