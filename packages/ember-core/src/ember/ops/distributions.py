"""Sampling ops with PyTorch's names, arguments and checks: ``ember.bernoulli``, ``ember.normal`` (its four
overloads), ``ember.poisson``, ``ember.multinomial`` and the Tensor methods ``bernoulli`` and ``multinomial``.

Each takes ``generator=`` (an :class:`ember.Generator` of the input's device) and otherwise draws from the device's
own stream. The distributions are PyTorch's; the individual samples cannot be (a different generator).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..autograd import no_grad
from ..bridge import check_dtype_supported
from ..dtypes import DType
from ..errors import DeviceError, DTypeError, ShapeError, ValueRangeError
from ..generator import check_generator, draw, host_rng
from ..shapes import broadcast_shapes
from ..tensor import Tensor
from .elementwise import tracks_grad
from .random import _affine, _number, _work_dtype, bernoulli_

Handle = Any


# -- out-of-place sampling: torch.bernoulli, normal, poisson, multinomial ------------------------------------------
# PyTorch gives their results a gradient function that returns zeros (bernoulli, normal, poisson): the samples
# depend on the parameters only through the sampler. keep_graph declares exactly that on a differentiable stack.
def _tensor_arg(op: str, x: Any, name: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: {name} must be a Tensor, got {type(x).__name__}")
    return x


def _floating_arg(op: str, x: Tensor, name: str = "input") -> None:
    if not x._dtype.is_floating_point:
        raise DTypeError(f"{op}: not implemented for {name} of dtype {x._dtype.name} (expected a floating point "
                         "tensor)")


def _all_true(cond: Tensor) -> bool:
    with no_grad():
        return bool(cond.all().item())


def _sampled(h: Handle, d: DType, dev: Any, inputs: tuple[Tensor, ...]) -> Tensor:
    """h (dtype d on dev) as a tensor whose gradient to each input that requires grad is zero (PyTorch's rule for
    sampling ops); on other stacks, or with grad mode off, just h."""
    stack = dev.stack
    hs = [t._h for t in inputs]
    if tracks_grad(stack, *hs):
        h = stack.keep_graph(h, hs)
    return Tensor._make(h, d, dev)


def _compare_dtype(dev: Any, *ds: DType) -> DType:
    """The dtype uniforms are drawn in to be compared with probabilities: float64 when one side is float64, else
    float32 (half precision compares in float32, as torch's kernels do)."""
    return dt.float64 if dt.float64 in ds and dt.float64 in dev.stack.supported_dtypes else dt.float32


def bernoulli(input: Tensor, p: Any = None, *, generator: Any = None) -> Tensor:  # noqa: A002 - torch's name
    """1 with probability ``input`` (elementwise, each in [0, 1]), else 0, in input's dtype (torch.bernoulli).
    ``bernoulli(input, p)`` draws every element with the number p instead, for input of any dtype (bool and
    integer too). The result gives a zero gradient to an input that requires grad, as in PyTorch."""
    x = _tensor_arg("bernoulli", input)
    dev = x._device
    gen = check_generator("bernoulli", generator, dev)
    if p is not None:
        with no_grad():
            out = Tensor._make(dev.stack.full(x.shape, 0, x._dtype), x._dtype, dev)
            bernoulli_(out, p, generator=gen)
        return _sampled(out._h, x._dtype, dev, (x,))
    _floating_arg("bernoulli", x)
    check_dtype_supported(dev, x._dtype, "bernoulli")
    if not _all_true((x >= 0) & (x <= 1)):  # NaN fails both comparisons, as in torch
        raise ValueRangeError("bernoulli: expects every probability in input to be in [0, 1] (and not NaN)")
    stack = dev.stack
    d = _compare_dtype(dev, x._dtype)
    with no_grad():
        ph = x._h if x._dtype is d else stack.cast(x._h, d)
        u = draw("bernoulli", gen, dev, "rand", x.shape, d)
        h = stack.cast(stack.binary("lt", u, ph), x._dtype)
    return _sampled(h, x._dtype, dev, (x,))


def _check_std(op: str, std: Any) -> None:
    if isinstance(std, Tensor):
        if not _all_true(std >= 0):  # NaN fails too
            raise ValueRangeError(f"{op}: expects all elements of std >= 0.0")
    elif not std >= 0:
        raise ValueRangeError(f"{op}: expects std >= 0.0, but found std {std:g}")


def normal(mean: Any, std: Any = 1.0, size: Any = None, *, generator: Any = None, dtype: Any = None,
           device: Any = None, requires_grad: bool = False) -> Tensor:
    """Samples of N(mean, std^2) (torch.normal), in PyTorch's four overloads:

    * ``normal(mean: Tensor, std: Tensor)``: elementwise, the two broadcast; the result has mean's dtype;
    * ``normal(mean: Tensor, std: float = 1.0)`` and ``normal(mean: float, std: Tensor)``: the tensor's shape and
      dtype;
    * ``normal(mean: float, std: float, size, *, dtype=None, device=None, requires_grad=False)``: a new tensor.

    std must be >= 0 everywhere (NaN refused). The tensor overloads give their inputs zero gradients (PyTorch's
    rule); ``size``, ``dtype``, ``device`` and ``requires_grad`` belong to the float overload only."""
    gm, gs = isinstance(mean, Tensor), isinstance(std, Tensor)
    if not gm and not gs:
        m, sd = _number(mean, "normal", "mean"), _number(std, "normal", "std")
        if size is None:
            raise DTypeError("normal: with a float mean and std, give size (normal(mean, std, size)); otherwise "
                             "pass mean or std as a Tensor")
        _check_std("normal", sd)
        from .creation import _random_float

        shape, d, dev = _random_float("normal", (size,) if isinstance(size, int) else tuple(size), dtype, device)
        w = _work_dtype(d)  # half precision draws and transforms in float32 and rounds once, as normal_ does
        stack = dev.stack
        with no_grad():
            h = _affine(stack, draw("normal", generator, dev, "randn", shape, w), sd, m)
            if w is not d:
                h = stack.cast(h, d)
        res = Tensor._make(h, d, dev)
        return res.requires_grad_(True) if requires_grad else res
    given = [n for n, v in (("size", size), ("dtype", dtype), ("device", device)) if v is not None]
    if requires_grad:
        given.append("requires_grad")
    if given:
        raise DTypeError(f"normal: {', '.join(given)} can only be given with a float mean and std (the tensor "
                         "overloads take the shape, dtype and device of their tensors)")
    ref = mean if gm else std
    _floating_arg("normal", ref, "mean" if gm else "std")
    dev, d = ref._device, ref._dtype
    if gm and gs:
        if std._device is not dev:
            raise DeviceError(f"normal: mean is on {dev} but std is on {std._device}")
        shape = broadcast_shapes(mean.shape, std.shape, op="normal")
    else:
        shape = ref.shape
    m = mean if gm else _number(mean, "normal", "mean")
    sd = std if gs else _number(std, "normal", "std")
    _check_std("normal", sd)
    gen = check_generator("normal", generator, dev)
    check_dtype_supported(dev, d, "normal")
    stack = dev.stack
    w = _work_dtype(d)

    def operand(v: Any) -> Any:
        if not isinstance(v, Tensor):
            return v
        return v._h if v._dtype is w else stack.cast(v._h, w)

    with no_grad():
        z = draw("normal", gen, dev, "randn", shape, w)
        h = stack.binary("add", stack.binary("mul", z, operand(sd)), operand(m))
        if tuple(h.shape) != shape:
            h = stack.expand(h, shape)
        if w is not d:
            h = stack.cast(h, d)
    return _sampled(h, d, dev, tuple(t for t in (mean, std) if isinstance(t, Tensor)))


#: rates past this are sampled by the normal approximation (numpy's Poisson sampler stops near 9.2e18)
_POISSON_NORMAL_ABOVE = 1e15


def poisson(input: Tensor, generator: Any = None) -> Tensor:  # noqa: A002 - torch's name
    """Poisson samples with rate ``input`` (elementwise, >= 0; NaN refused), in input's floating dtype
    (torch.poisson). ember has no device kernel for it: the samples are drawn on the host by a numpy generator
    seeded with one draw from ``generator`` (else from the device's stream), so the same seed repeats them, and
    uploaded. Rates above 1e15 use the normal approximation; an infinite rate gives inf (PyTorch gives garbage)."""
    x = _tensor_arg("poisson", input)
    _floating_arg("poisson", x)
    dev = x._device
    gen = check_generator("poisson", generator, dev)
    if not _all_true(x >= 0):
        raise ValueRangeError("poisson: invalid Poisson rate, expected every rate to be non-negative (and not NaN)")
    if x.numel() == 0:
        with no_grad():
            return _sampled(dev.stack.full(x.shape, 0, x._dtype), x._dtype, dev, (x,))
    rng = host_rng("poisson", gen, dev)
    lam = np.asarray(dev.stack.to_numpy(x._h), dtype=np.float64)
    big = lam > _POISSON_NORMAL_ABOVE
    k = rng.poisson(np.where(big, 0.0, lam)).astype(np.float64)
    if big.any():
        with np.errstate(invalid="ignore", over="ignore"):
            approx = np.round(lam + np.sqrt(lam) * rng.standard_normal(lam.shape))
        k = np.where(big, np.where(np.isinf(lam), np.inf, np.maximum(approx, 0.0)), k)
    with no_grad():
        h = dev.stack.from_numpy(np.ascontiguousarray(k.astype(x._dtype.numpy)))
    return _sampled(h, x._dtype, dev, (x,))


_MULTINOMIAL_MAX_CATEGORIES = 2**24
_KEYS_PER_CHUNK = 2**22  # elements of the (rows, samples, categories) key block drawn at once with replacement


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,  # noqa: A002 - torch's name
                generator: Any = None) -> Tensor:
    """Indices (int64) of ``num_samples`` categories drawn from the weights in each row of ``input`` (1-d: one
    distribution; 2-d: one per row), with or without ``replacement`` (torch.multinomial). Weights need not sum to
    one but must be finite and >= 0 with a positive sum per row. Without replacement each category is drawn at most
    once (num_samples <= categories; zero-weight categories come last, once the others are used up, as in torch).

    Sampling is exponential races (the Gumbel-max trick): category i's key is w_i / E_i with E_i ~ Exp(1); the
    largest key is a draw from the weights, and the k largest keys are k draws without replacement in order."""
    x = _tensor_arg("multinomial", input)
    if not x._dtype.is_floating_point:
        raise DTypeError(f"multinomial: only floating point dtypes are supported for input, got {x._dtype.name}")
    if x.ndim not in (1, 2):
        raise ShapeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {x.shape}")
    if isinstance(num_samples, np.integer):
        num_samples = int(num_samples)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int):
        raise DTypeError(f"multinomial: num_samples must be an int, got {type(num_samples).__name__}")
    if not isinstance(replacement, (bool, np.bool_)):
        raise DTypeError(f"multinomial: replacement must be a bool, got {type(replacement).__name__}")
    dev = x._device
    gen = check_generator("multinomial", generator, dev)
    k = x.shape[-1]
    if num_samples <= 0:
        raise ValueRangeError(f"multinomial: cannot sample n_sample <= 0 samples (got {num_samples})")
    if not replacement and num_samples > k:
        raise ValueRangeError(f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples without "
                              f"replacement ({num_samples} > {k})")
    if k > _MULTINOMIAL_MAX_CATEGORIES:
        raise ValueRangeError(f"multinomial: number of categories cannot exceed 2^24 (got {k})")
    rows = 1 if x.ndim == 1 else x.shape[0]
    stack = dev.stack
    out_shape = (num_samples,) if x.ndim == 1 else (rows, num_samples)
    if rows == 0:
        return Tensor._make(stack.full(out_shape, 0, dt.int64), dt.int64, dev)
    if not _all_true((x >= 0) & (x < math.inf)):  # NaN fails both
        raise ValueRangeError("multinomial: probability tensor contains either inf, nan or element < 0")
    with no_grad():
        positive = x.sum(-1) > 0 if k else None
    if positive is None or not _all_true(positive):
        raise ValueRangeError("multinomial: invalid multinomial distribution (sum of probabilities <= 0)")
    d = _compare_dtype(dev, dt.float64)
    tiny = float(np.finfo(d.numpy).tiny)
    with no_grad():
        w = x._h if x._dtype is d else stack.cast(x._h, d)
        w = stack.reshape(w, (rows, k))

        def keys(shape: tuple[int, ...], weights: Handle) -> Handle:
            u = draw("multinomial", gen, dev, "rand", shape, d)
            e = stack.binary("maximum", stack.unary("neg", stack.unary("log1p", stack.unary("neg", u))), tiny)
            return stack.binary("div", weights, e)  # E > 0, so a zero weight keeps key 0 and a positive one wins

        if not replacement:
            _, idx = stack.topk(keys((rows, k), w), num_samples, 1, True, True)
        else:
            per = max(1, _KEYS_PER_CHUNK // max(1, rows * k))
            w3 = stack.reshape(w, (rows, 1, k))
            parts = []
            for start in range(0, num_samples, per):
                n = min(per, num_samples - start)
                parts.append(stack.argreduce("argmax", keys((rows, n, k), w3), 2, False))
            idx = parts[0] if len(parts) == 1 else stack.cat(parts, 1)
        idx = stack.reshape(idx, out_shape)
    return Tensor._make(idx, dt.int64, dev)


def _tensor_bernoulli(self: Tensor, p: Any = None, *, generator: Any = None) -> Tensor:
    """``Tensor.bernoulli(p=None, *, generator=None)``: :func:`bernoulli` of self."""
    return bernoulli(self, p, generator=generator)


def _tensor_multinomial(self: Tensor, num_samples: int, replacement: bool = False, *,
                        generator: Any = None) -> Tensor:
    """``Tensor.multinomial(num_samples, replacement=False, *, generator=None)``: :func:`multinomial` of self."""
    return multinomial(self, num_samples, replacement, generator=generator)


__all__: list[str] = ["bernoulli", "normal", "poisson", "multinomial"]

TENSOR_METHODS: dict[str, Any] = {
    "bernoulli": _tensor_bernoulli,
    "multinomial": _tensor_multinomial,
}
