"""In-place random fills with PyTorch's names, arguments and checks: ``x.uniform_(a, b)``, ``x.normal_()``,
``x.bernoulli_(p)``, ``x.exponential_()``, ``x.random_(lo, hi)``, ``x.log_normal_()``, ``x.cauchy_()``,
``x.geometric_(p)``.

Samples come from the tensor's own device random stream (``tensor.device.seed(n)`` reproduces them); the
distributions are PyTorch's, the individual samples cannot be (a different generator). Every fill draws and
transforms its samples outside the gradient graph and then writes them the way ``fill_`` does: the stack's
``assign``, so a differentiable stack applies PyTorch's in-place rules (a leaf that requires grad is refused unless
grad mode is off, the version counter is bumped, a tracked non-leaf keeps its place in the graph with a zero
gradient to what it held before). Half-precision tensors are drawn and transformed in float32 and rounded once.
"""

from __future__ import annotations

import math
import warnings
from functools import cache
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..autograd import no_grad
from ..bridge import check_dtype_supported
from ..dtypes import DType
from ..errors import AutodiffError, DeviceError, DTypeError, ShapeError, ValueRangeError
from ..generator import check_generator, draw
from ..shapes import broadcast_shapes
from ..tensor import Tensor
from .elementwise import tracks_grad

Handle = Any

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FROM_DEFAULT = 0.0  # uniform_'s default from; identity tells "not given" from an explicit from_


# -- helpers ------------------------------------------------------------------------------------------------------
def _target(self: Any, op: str, floating: bool) -> Tensor:
    """self, checked: a Tensor, of a floating dtype for the continuous distributions (as PyTorch), and not a leaf
    that requires grad while grad mode is on (refused before anything is drawn, naming the fill)."""
    if not isinstance(self, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(self).__name__}")
    if floating and not self._dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating point tensor, got dtype {self._dtype.name} (the distribution "
                         "is continuous)")
    if tracks_grad(self._device.stack, self._h) and self.is_leaf:
        raise AutodiffError(f"{op}: a leaf tensor that requires grad is being used in an in-place operation; wrap "
                            "it in `with ember.no_grad():` (as nn.init does) or clone() it first")
    return self


def _number(v: Any, op: str, name: str) -> float:
    """A distribution parameter as a Python float: a number, a numpy scalar or a one-element tensor (torch takes
    those too)."""
    if isinstance(v, Tensor):
        if v.numel() != 1:
            raise ShapeError(f"{op}: {name} must be a number or a one-element tensor, got shape {v.shape}")
        v = v.item()
    if isinstance(v, np.generic):
        v = v.item()
    if not isinstance(v, (bool, int, float)):
        raise DTypeError(f"{op}: {name} must be a number, got {type(v).__name__}")
    return float(v)


def _work_dtype(d: DType) -> DType:
    """The dtype samples are drawn and transformed in: half precision in float32, rounded once when stored."""
    return dt.float32 if d.itemsize < 4 else d


@cache
def _finfo(d: DType) -> tuple[float, int]:
    """(largest finite value, mantissa digits) of a float dtype; ml_dtypes knows bfloat16 as well."""
    import ml_dtypes

    info = ml_dtypes.finfo(d.numpy)
    return float(info.max), int(info.nmant) + 1


def _draw(self: Tensor, kind: str, d: DType, op: str = "", generator: Any = None) -> Handle:
    """A handle of uniform [0, 1) ('rand') or standard normal ('randn') samples of dtype d shaped like self, from
    ``generator`` (already checked) when given, else from self's device stream."""
    check_dtype_supported(self._device, d, kind)
    with no_grad():
        return draw(op or kind, generator, self._device, kind, self.shape, d)


def _store(self: Tensor, h: Handle, d: DType) -> Tensor:
    """Write handle h (dtype d, self's shape) into self, as ``fill_`` writes: through ``assign`` with grad mode as
    the caller has it, so a differentiable stack refuses a leaf that requires grad and bumps the version counter,
    while the samples themselves never join the graph."""
    stack = self._device.stack
    if d is not self._dtype:
        with no_grad():
            h = stack.cast(h, self._dtype)
    stack.assign(self._h, h)
    return self


def _affine(stack: Any, h: Handle, scale: float, shift: float) -> Handle:
    """h * scale + shift (the order nn.init has always used, so seeded values stay the same)."""
    return stack.binary("add", stack.binary("mul", h, scale), shift)


# -- continuous distributions -------------------------------------------------------------------------------------
def uniform_(self: Tensor, from_: Any = _FROM_DEFAULT, to: Any = 1.0, *, generator: Any = None,
             **kwargs: Any) -> Tensor:
    """Fill with samples from the continuous uniform distribution on [from, to).

    ``from`` is a Python keyword: pass it positionally (``x.uniform_(-1, 1)``), as ``from_=`` or as
    ``**{"from": -1}`` (what torch's argument parser accepts)."""
    from_ = _from_kwarg("uniform_", from_, _FROM_DEFAULT, kwargs)
    _target(self, "uniform_", floating=True)
    gen = check_generator("uniform_", generator, self._device)
    lo, hi = _number(from_, "uniform_", "from"), _number(to, "uniform_", "to")
    fmax, _ = _finfo(self._dtype)
    for name, v in (("from", lo), ("to", hi)):
        if not -fmax <= v <= fmax:  # NaN and infinities fail too
            raise ValueRangeError(f"uniform_: {name}={v} is out of bounds for {self._dtype.name}")
    if lo > hi:
        raise ValueRangeError(f"uniform_: expects to return a [from, to) range, but found from={lo:g} > to={hi:g}")
    if hi - lo > fmax:
        raise ValueRangeError(f"uniform_: expects to-from <= the largest {self._dtype.name} ({fmax:g}), but found "
                              f"to={hi:g} and from={lo:g}")
    d = _work_dtype(self._dtype)
    stack = self._device.stack
    with no_grad():
        h = _affine(stack, _draw(self, "rand", d, "uniform_", gen), hi - lo, lo)
    return _store(self, h, d)


def normal_(self: Tensor, mean: Any = 0.0, std: Any = 1.0, *, generator: Any = None) -> Tensor:
    """Fill with samples from the normal distribution N(mean, std^2); std >= 0 (std 0 fills with mean)."""
    _target(self, "normal_", floating=True)
    gen = check_generator("normal_", generator, self._device)
    m, s = _number(mean, "normal_", "mean"), _number(std, "normal_", "std")
    if not s >= 0:
        raise ValueRangeError(f"normal_: expects std >= 0.0, but found std {s:g}")
    d = _work_dtype(self._dtype)
    stack = self._device.stack
    with no_grad():
        h = _affine(stack, _draw(self, "randn", d, "normal_", gen), s, m)
    return _store(self, h, d)


def log_normal_(self: Tensor, mean: Any = 1.0, std: Any = 2.0, *, generator: Any = None) -> Tensor:
    """Fill with exp(N(mean, std^2)) samples; std > 0."""
    _target(self, "log_normal_", floating=True)
    gen = check_generator("log_normal_", generator, self._device)
    m, s = _number(mean, "log_normal_", "mean"), _number(std, "log_normal_", "std")
    if not s > 0:
        raise ValueRangeError(f"log_normal_: expects std > 0.0, but found std={s:g}")
    d = _work_dtype(self._dtype)
    stack = self._device.stack
    with no_grad():
        h = stack.unary("exp", _affine(stack, _draw(self, "randn", d, "log_normal_", gen), s, m))
    return _store(self, h, d)


def exponential_(self: Tensor, lambd: Any = 1.0, *, generator: Any = None) -> Tensor:
    """Fill with samples from the exponential distribution of rate lambd > 0 (density lambd * exp(-lambd x))."""
    _target(self, "exponential_", floating=True)
    gen = check_generator("exponential_", generator, self._device)
    lam = _number(lambd, "exponential_", "lambd")
    if not lam > 0:
        raise ValueRangeError(f"exponential_: expects lambda > 0.0, but found lambda={lam:g}")
    d = _work_dtype(self._dtype)
    stack = self._device.stack
    with no_grad():
        # inverse CDF: -log(1 - u) / lambd; u in [0, 1) keeps the log finite
        u = _draw(self, "rand", d, "exponential_", gen)
        h = stack.binary("div", stack.unary("log1p", stack.unary("neg", u)), -lam)
        h = stack.unary("abs", h)  # u = 0 gives -0.0; torch never returns a negative zero
    return _store(self, h, d)


def cauchy_(self: Tensor, median: Any = 0.0, sigma: Any = 1.0, *, generator: Any = None) -> Tensor:
    """Fill with samples from the Cauchy distribution: median + sigma * tan(pi * (u - 1/2)); sigma > 0."""
    _target(self, "cauchy_", floating=True)
    gen = check_generator("cauchy_", generator, self._device)
    med, sig = _number(median, "cauchy_", "median"), _number(sigma, "cauchy_", "sigma")
    if not sig > 0:
        raise ValueRangeError(f"cauchy_: expects sigma > 0.0, but found sigma={sig:g}")
    d = _work_dtype(self._dtype)
    stack = self._device.stack
    with no_grad():
        t = stack.unary("tan", _affine(stack, _draw(self, "rand", d, "cauchy_", gen), math.pi, -math.pi / 2))
        h = _affine(stack, t, sig, med)
    return _store(self, h, d)


# -- discrete distributions ---------------------------------------------------------------------------------------
def _discrete_work_dtype(d: DType) -> DType:
    """Discrete fills of integer and bool tensors draw in float32 (float64 for 64-bit targets, whose values
    float32 could not resolve)."""
    return dt.float64 if d.itemsize == 8 else dt.float32


def bernoulli_(self: Tensor, p: Any = 0.5, *, generator: Any = None) -> Tensor:
    """Fill with 1 with probability p, else 0. p is a number in [0, 1] or a floating tensor of probabilities
    that broadcasts to self's shape. Any dtype (bool and integer tensors too)."""
    _target(self, "bernoulli_", floating=False)
    gen = check_generator("bernoulli_", generator, self._device)
    stack = self._device.stack
    if isinstance(p, Tensor):
        if p._device is not self._device:
            raise DeviceError(f"bernoulli_: expected p on device {self._device}, got {p._device}")
        if not p._dtype.is_floating_point:
            raise DTypeError(f"bernoulli_: p must be a floating point tensor, got dtype {p._dtype.name}")
        if len(p.shape) > self.ndim or broadcast_shapes(self.shape, p.shape, op="bernoulli_") != self.shape:
            raise ShapeError(f"bernoulli_: p of shape {p.shape} cannot be broadcast to self's shape {self.shape}")
        with no_grad():
            in_range = bool(((p >= 0) & (p <= 1)).all().item())  # NaN fails both comparisons, as in torch
        if not in_range:
            raise ValueRangeError("bernoulli_: expects every element of p to be in [0, 1]")
        d = dt.float64 if dt.float64 in (self._dtype, p._dtype) else dt.float32
        with no_grad():
            ph = p._h if p._dtype is d else stack.cast(p._h, d)
            h = stack.binary("lt", _draw(self, "rand", d, "bernoulli_", gen), ph)
    else:
        prob = _number(p, "bernoulli_", "p")
        if not 0 <= prob <= 1:
            raise ValueRangeError(f"bernoulli_: expects p to be in [0, 1], but got p={prob:g}")
        d = dt.float64 if self._dtype is dt.float64 else dt.float32
        with no_grad():
            h = stack.binary("lt", _draw(self, "rand", d, "bernoulli_", gen), prob)  # u < 1 always, u < 0 never
    return _store(self, h, dt.bool_)


def geometric_(self: Tensor, p: Any, *, generator: Any = None) -> Tensor:
    """Fill with the number of Bernoulli(p) trials up to the first success (1, 2, ...); p in (0, 1). Integer and
    floating tensors (PyTorch refuses bool)."""
    _target(self, "geometric_", floating=False)
    if self._dtype.is_bool:
        raise DTypeError("geometric_: not implemented for dtype bool")
    gen = check_generator("geometric_", generator, self._device)
    prob = _number(p, "geometric_", "p")
    if not 0 < prob < 1:
        raise ValueRangeError(f"geometric_: expects p to be in (0, 1), but got p={prob:g}")
    d = _work_dtype(self._dtype) if self._dtype.is_floating_point else _discrete_work_dtype(self._dtype)
    stack = self._device.stack
    with no_grad():
        # inverse CDF: ceil(log(1 - u) / log(1 - p)); u = 0 would give 0, outside the support, so the floor is 1
        u = _draw(self, "rand", d, "geometric_", gen)
        k = stack.unary("ceil", stack.binary("div", stack.unary("log1p", stack.unary("neg", u)), math.log1p(-prob)))
        h = stack.binary("maximum", k, 1.0)
    return _store(self, h, d)


def _from_kwarg(op: str, from_: Any, default: Any, kwargs: dict[str, Any]) -> Any:
    """Accept torch's ``from`` keyword (only reachable as ``**{"from": v}``) besides ``from_``."""
    if "from" in kwargs:
        if from_ is not default:  # an explicit from_ besides from (one equal to the default cannot be told apart)
            raise DTypeError(f"{op}: got 'from' twice (positionally or as from_, and as from)")
        from_ = kwargs.pop("from")
    if kwargs:
        raise DTypeError(f"{op}: unexpected keyword argument {next(iter(kwargs))!r}")
    return from_


def _random_bound(v: Any, name: str) -> int:
    if isinstance(v, np.integer):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise DTypeError(f"random_: {name} must be an int, got {type(v).__name__} {v!r}")
    if not _INT64_MIN <= v <= _INT64_MAX:  # torch parses both as int64
        raise ValueRangeError(f"random_: {name}={v} does not fit int64")
    return v


def random_(self: Tensor, *args: Any, generator: Any = None, **kwargs: Any) -> Tensor:
    """Fill with integers drawn uniformly, PyTorch's overloads: ``random_()`` from [0, top], ``random_(to)`` from
    [0, to), ``random_(from, to)`` from [from, to) (``to=None``: [from, top]). top is the dtype's largest value
    for integer dtypes, 1 for bool and 2**mantissa for floating dtypes (the largest range whose integers they all
    hold). Any dtype; both ends of the range must be values of it."""
    _target(self, "random_", floating=False)
    gen = check_generator("random_", generator, self._device)
    if len(args) > 2:
        raise DTypeError(f"random_: takes at most 2 positional arguments (from, to), got {len(args)}")
    if "from_" in kwargs:
        kwargs["from"] = kwargs.pop("from_")
    unknown = set(kwargs) - {"from", "to"}
    if unknown:
        raise DTypeError(f"random_: unexpected keyword argument {sorted(unknown)[0]!r}")
    if len(args) == 1 and not kwargs:
        lo, hi = 0, args[0]  # random_(to)
    else:
        named = dict(zip(("from", "to"), args))
        if set(named) & set(kwargs):
            raise DTypeError(f"random_: got {sorted(set(named) & set(kwargs))[0]!r} twice")
        named.update(kwargs)
        lo, hi = named.get("from", 0), named.get("to")
    d = self._dtype
    if d.is_bool:
        dlo, dhi, top = 0, 1, 1
    elif d.is_floating_point:
        fmax, digits = _finfo(d)
        dlo, dhi, top = -fmax, fmax, 2**digits
    else:
        dlo, dhi = dt.int_range(d)
        top = dhi
    lo = _random_bound(lo, "from")
    hi = top + 1 if hi is None else _random_bound(hi, "to")
    if lo >= hi:
        raise ValueRangeError(f"random_: expects 'from' to be less than 'to', but got from={lo} >= to={hi}")
    if not dlo <= lo <= dhi:
        raise ValueRangeError(f"random_: from={lo} is out of bounds for {d.name}")
    if not dlo <= hi - 1 <= dhi:
        raise ValueRangeError(f"random_: to - 1 = {hi - 1} is out of bounds for {d.name}")
    if d.is_floating_point and (lo < -top or hi - 1 > top):
        warnings.warn(f"random_: the range [{lo}, {hi}) exceeds [-2**{top.bit_length() - 1}, "
                      f"2**{top.bit_length() - 1}]: {d.name} cannot hold every integer in it, so the draws are "
                      "rounded", stacklevel=2)
    check_dtype_supported(self._device, d, "random_")
    with no_grad():
        h = draw("random_", gen, self._device, "randint", self.shape, d, lo, hi)
    return _store(self, h, d)


# torch exports no functions for these fills (ember.bernoulli/normal and friends are in ops/distributions.py)
__all__: list[str] = []

TENSOR_METHODS: dict[str, Any] = {
    "uniform_": uniform_,
    "normal_": normal_,
    "log_normal_": log_normal_,
    "exponential_": exponential_,
    "cauchy_": cauchy_,
    "bernoulli_": bernoulli_,
    "geometric_": geometric_,
    "random_": random_,
}
