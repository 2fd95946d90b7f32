"""Conformance: gradients of every differentiable op, on the device under test decorated with autodiff.

The fixture ``ad`` is the device under test when it already records gradients (``--ember-device=flex+autodiff``),
else ``device.autodiff()`` when the autodiff decorator is installed; without it the module is skipped. Every
case of the table below is one op applied to float64 leaves, written once for both libraries
(``fn(lib, F, *leaves)`` with ``lib`` = ember or torch), and checked two ways:

* finite differences: central differences (eps 1e-6) of ``sum(out * w)`` for a random cotangent ``w``, one
  coordinate at a time for inputs of at most 30 elements, along random directions for larger ones;
* torch autograd: the same function and cotangent differentiated by PyTorch (incl. broadcasting, non-contiguous
  views made inside the function, and tie rules that finite differences cannot see).

A device that does not decorate an autodiff stack itself also runs a sample of the cases (and a small CNN) with
``checkpointing="balanced"`` and requires bit-identical gradients. The error paths of the gradient API
(``backward``, ``ember.autograd.grad``, ``no_grad``, ``detach``, in-place checks) close the module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import ember
from ember import AutodiffError, DeviceError, DTypeError, opinfo
from ember.nn import functional as EF
from ember.plugins.manager import registry
from ember.testing import require_dtype, torch_or_skip
from ember.testing._helpers import raises

torch = torch_or_skip()
TF = torch.nn.functional

EPS = 1e-6  # central-difference step (float64)
RTOL = 1e-5  # finite differences vs analytic gradient
ATOL = 1e-7  # times max(1, largest gradient entry): rounding noise of the differences
TORCH_RTOL, TORCH_ATOL = 1e-7, 1e-10  # two float64 implementations of the same gradient
MAX_COORDS = 30  # inputs up to this size are perturbed one coordinate at a time
DIRECTIONS = 3  # random directions for larger inputs

#: the unary primitives with a gradient (the op registry's; predicates and bitwise ops return bool/int tensors)
DIFFERENTIABLE_UNARY = sorted(op.name for op in opinfo.select(arity=1, kind="primitive") if op.differentiable)


# ------------------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------------------
def _autodiff_installed() -> bool:
    from ember.plugins import registry

    registry.ensure_loaded()
    return registry.differentiable_decorator() is not None  # a declared capability, not a name


@pytest.fixture(scope="module")
def ad(device: Any) -> Any:
    """The device under test with gradient recording: itself if differentiable, else ``device.autodiff()``."""
    if getattr(device.stack, "differentiable", False):
        return device
    if not _autodiff_installed():
        pytest.skip("ember-autodiff is not installed")
    return device.autodiff()


@pytest.fixture
def on_ad(ad: Any) -> Iterator[Any]:
    """Make ``ad`` ember's default device for the test, so constants built with ``ember.tensor`` land on it."""
    previous = ember.default_device()
    ember.set_default_device(ad)
    try:
        yield ad
    finally:
        ember.set_default_device(previous)


@pytest.fixture
def f64(on_ad: Any) -> Any:
    require_dtype(on_ad, ember.float64)
    return on_ad


def _undecorated(device: Any) -> Any:
    """The device under test without its autodiff decorator (the base of ``ad``), or None if it has others.
    Settings of automatic decorators (``flex+fusion(enabled=False)``) belong to the base and are kept."""
    from ember.device import Device
    from ember.plugins.manager import registry

    automatic = {d.name for d in registry.automatic_decorators()}
    kept = tuple(d for d in device.decorators if d[0] in automatic)
    others = [d for d in device.decorators if d[0] not in automatic]
    if not others:
        return device
    grads = registry.differentiable_decorator()
    if len(others) == 1 and grads is not None and others[0][0] == grads.name:
        return Device(device.kind, device.index, device.options, kept)
    return None


@pytest.fixture(scope="module")
def balanced(device: Any) -> Any:
    """The base device with balanced checkpointing, or skip when the device is decorated by something else."""
    base = _undecorated(device)
    if base is None or getattr(base.stack, "differentiable", False):
        pytest.skip(f"device {device} is not a plain backend (+autodiff): no checkpointing variant to compare")
    if not _autodiff_installed():
        pytest.skip("ember-autodiff is not installed")
    return base.autodiff(checkpointing="balanced")


# ------------------------------------------------------------------------------------------------------------
# the gradient checker
# ------------------------------------------------------------------------------------------------------------
Fn = Callable[..., Any]


@dataclass(frozen=True)
class Case:
    """One op to differentiate: ``fn(lib, F, *leaves)`` -> tensor or tuple of tensors; ``inputs`` the leaves."""

    id: str
    fn: Fn
    inputs: tuple[np.ndarray, ...]
    fd: bool = True  # finite differences apply (False at ties, where only the torch rule is defined)
    torch: bool = True  # torch runs the same function


def _outs(res: Any) -> list[Any]:
    return list(res) if isinstance(res, tuple | list) else [res]


def _cotangents(shapes: Sequence[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def ember_grads(fn: Fn, arrays: Sequence[np.ndarray], seed: int = 0, device: Any = None
                ) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
    """Gradients of ``sum(out * w)`` by ember's backward (random cotangents ``w``, returned too)."""
    leaves = [ember.tensor(a, device=device, requires_grad=True) for a in arrays]
    outs = _outs(fn(ember, EF, *leaves))
    for o in outs:
        assert o.requires_grad, f"an output of shape {o.shape} is not tracked (grad_fn {o.grad_fn})"
        assert o.device is leaves[0].device, f"op result on {o.device}, inputs on {leaves[0].device}"
    ws = _cotangents([tuple(o.shape) for o in outs], seed)
    ember.autograd.backward(outs, [ember.tensor(w, device=device) for w in ws])
    return [None if t.grad is None else t.grad.numpy() for t in leaves], ws


def torch_grads(fn: Fn, arrays: Sequence[np.ndarray], ws: Sequence[np.ndarray]) -> list[np.ndarray | None]:
    leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    outs = _outs(fn(torch, TF, *leaves))
    torch.autograd.backward(outs, [torch.tensor(w) for w in ws])
    return [None if t.grad is None else t.grad.numpy() for t in leaves]


def _phi(fn: Fn, arrays: Sequence[np.ndarray], ws: Sequence[np.ndarray]) -> float:
    """The scalar ``sum(out * w)`` computed without recording."""
    with ember.no_grad():
        outs = _outs(fn(ember, EF, *[ember.tensor(a) for a in arrays]))
    return math.fsum(float(np.sum(o.numpy() * w)) for o, w in zip(outs, ws))


def check_fd(name: str, fn: Fn, arrays: Sequence[np.ndarray], grads: Sequence[np.ndarray | None],
             ws: Sequence[np.ndarray]) -> None:
    """Compare analytic gradients with central differences of ``sum(out * w)``."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    rng = np.random.default_rng(99)
    for i, (a, g) in enumerate(zip(arrays, grads)):
        if g is None:  # the input does not reach the outputs (allowed if the differences agree: zero)
            g = np.zeros_like(a)
        assert g.shape == a.shape, f"{name}: gradient of input {i} has shape {g.shape}, input {a.shape}"

        def at(v: np.ndarray, i: int = i) -> float:
            return _phi(fn, [*arrays[:i], v, *arrays[i + 1:]], ws)

        if a.size <= MAX_COORDS:
            num = np.empty(a.size)
            for j in range(a.size):
                d = np.zeros(a.size)
                d[j] = EPS
                d = d.reshape(a.shape)
                num[j] = (at(a + d) - at(a - d)) / (2 * EPS)
            num = num.reshape(a.shape)
            np.testing.assert_allclose(g, num, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(num).max(initial=0))),
                                       err_msg=f"{name}: gradient of input {i} vs finite differences")
        else:
            for _ in range(DIRECTIONS):
                v = rng.standard_normal(a.shape)
                num_d = (at(a + EPS * v) - at(a - EPS * v)) / (2 * EPS)
                ana_d = float(np.sum(g * v))
                tol = ATOL * max(1.0, float(np.sum(np.abs(g * v)))) + RTOL * abs(num_d)
                assert abs(ana_d - num_d) <= tol, (
                    f"{name}: directional derivative of input {i}: backward gives {ana_d!r}, "
                    f"finite differences {num_d!r}")


def check_torch(name: str, grads: Sequence[np.ndarray | None], ref: Sequence[np.ndarray | None]) -> None:
    for i, (g, r) in enumerate(zip(grads, ref)):
        if r is None:  # torch: the input does not reach the outputs
            assert g is None or not np.any(g), f"{name}: input {i} gets a nonzero gradient, torch gives None"
            continue
        assert g is not None, f"{name}: no gradient reached input {i}; torch gives one"
        scale = max(1.0, float(np.abs(r).max(initial=0)))
        np.testing.assert_allclose(g, r, rtol=TORCH_RTOL, atol=TORCH_ATOL * scale,
                                   err_msg=f"{name}: gradient of input {i} vs torch autograd")


def run_case(case: Case) -> None:
    grads, ws = ember_grads(case.fn, case.inputs)
    if case.torch:
        check_torch(case.id, grads, torch_grads(case.fn, case.inputs, ws))
    if case.fd:
        check_fd(case.id, case.fn, case.inputs, grads, ws)


# ------------------------------------------------------------------------------------------------------------
# inputs: small, reproducible, inside each op's smooth domain
# ------------------------------------------------------------------------------------------------------------
_SEED = iter(range(10_000, 100_000))


def N(*shape: int, scale: float = 1.0) -> np.ndarray:  # noqa: N802 - reads as "Normal"
    return np.random.default_rng(next(_SEED)).standard_normal(shape) * scale


def U(lo: float, hi: float, *shape: int) -> np.ndarray:  # noqa: N802 - reads as "Uniform"
    return np.random.default_rng(next(_SEED)).uniform(lo, hi, shape)


def NZ(*shape: int) -> np.ndarray:  # noqa: N802 - reads as "NonZero"
    """Values of magnitude 0.5..2 with random signs (away from the kinks and poles at 0)."""
    rng = np.random.default_rng(next(_SEED))
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def I(*values: Any) -> np.ndarray:  # noqa: N802, E743 - reads as "Index"
    return np.array(values, dtype=np.int64)


CASES: list[Case] = []


def case(id: str, fn: Fn, *inputs: np.ndarray, fd: bool = True, torch: bool = True) -> None:  # noqa: A002
    CASES.append(Case(id, fn, tuple(np.asarray(a, dtype=np.float64) for a in inputs), fd, torch))


# -- unary: every differentiable unary primitive, contiguous and on a transposed view, on its registry domain ------
_DOMAIN: dict[str, Callable[[], np.ndarray]] = {  # opinfo.DOMAINS -> float64 samples of shape (4, 3)
    "real": lambda: N(4, 3),
    "positive": lambda: U(0.3, 3.0, 4, 3),
    "above_minus_one": lambda: U(-0.6, 2.0, 4, 3),
    "above_one": lambda: U(1.2, 3.0, 4, 3),
    "open_unit": lambda: U(-0.9, 0.9, 4, 3),
    "half_period": lambda: U(-1.2, 1.2, 4, 3),
    "nonzero": lambda: NZ(4, 3),
    # step functions: values away from the jumps, so the differences see the zero gradient
    "off_integers": lambda: np.round(N(4, 3, scale=3.0)) + U(0.1, 0.4, 4, 3),
}
for _op in DIFFERENTIABLE_UNARY:
    _x = _DOMAIN[opinfo.get(_op).domain]()
    case(f"unary-{_op}", lambda e, F, x, op=_op: getattr(e, op)(x), _x)
    case(f"unary-{_op}-noncontiguous", lambda e, F, x, op=_op: getattr(e, op)(x.T), _x)
case("unary-square", lambda e, F, x: e.square(x), N(3, 4))
case("unary-frac", lambda e, F, x: e.frac(x), _DOMAIN[opinfo.get("frac").domain]())
case("unary-method-chain", lambda e, F, x: (x.exp() * 0.5).sin().tanh(), N(3, 4))
case("unary-nan_to_num", lambda e, F, x: e.nan_to_num(x.log()), U(0.3, 2.0, 3, 4))

# -- binary, with broadcasting (3,1,4) x (2,4) -> (3,2,4), scalars and views -------------------------------------
_BINARY_INPUTS: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
    "pow": lambda: (U(0.5, 2.0, 3, 1, 4), N(2, 4)),
    "div": lambda: (N(3, 1, 4), NZ(2, 4)),
    "remainder": lambda: (N(3, 1, 4, scale=3.0), NZ(2, 4)),
    "fmod": lambda: (N(3, 1, 4, scale=3.0), NZ(2, 4)),
    "copysign": lambda: (NZ(3, 1, 4), NZ(2, 4)),
}
#: the binary primitives with a (nonzero) gradient, from the op registry
BINARY = tuple(op.name for op in opinfo.select(arity=2, kind="primitive") if op.grad == "smooth")
for _op in BINARY:
    _a, _b = _BINARY_INPUTS.get(_op, lambda: (N(3, 1, 4), N(2, 4)))()
    case(f"binary-{_op}-broadcast", lambda e, F, a, b, op=_op: getattr(e, op)(a, b), _a, _b)
    case(f"binary-{_op}-noncontiguous",
         lambda e, F, a, b, op=_op: (getattr(e, op)(a[:, 0, ::2], b[1, ::2]), getattr(e, op)(a[:, 0].T, b.T[:, :1])),
         _a, _b)
    # both operands from one leaf: the two gradients add up (the base of pow must stay positive)
    case(f"binary-{_op}-same-input", lambda e, F, a, op=_op: getattr(e, op)(a, a.flip(0)), _a if _op == "pow" else _b)
case("binary-scalar-rsub", lambda e, F, x: 2.5 - x, N(3, 4))
case("binary-scalar-rdiv", lambda e, F, x: 2.5 / x, NZ(3, 4))
case("binary-scalar-div", lambda e, F, x: x / 2.5 + x * 3.0 - 1.0, N(3, 4))
case("binary-scalar-pow", lambda e, F, x: x ** 3 + x ** 0.5, U(0.5, 2.0, 3, 4))
case("binary-scalar-rpow", lambda e, F, x: 2.0 ** x, N(3, 4))
case("binary-pow-zero-exponent", lambda e, F, x: e.pow(x, e.tensor(np.array([0.0, 1.0, 2.0]))), N(4, 3))
case("binary-maximum-ties", lambda e, F, a, b: e.maximum(a, b), np.array([1.0, 2.0, 3.0, -1.0]),
     np.array([1.0, 0.0, 3.0, -1.0]), fd=False)
case("binary-minimum-ties", lambda e, F, a, b: e.minimum(a, b), np.array([1.0, 2.0, 3.0]),
     np.array([1.0, 5.0, 3.0]), fd=False)
case("binary-fmax-ties", lambda e, F, a, b: e.fmax(a, b), np.array([1.0, 2.0]), np.array([1.0, 0.0]), fd=False)
case("binary-max-min-nan", lambda e, F, a, b: (e.maximum(a, b), e.minimum(a, b), e.fmax(a, b), e.fmin(a, b)),
     np.array([1.0, math.nan, 2.0, 3.0, 1.0]), np.array([1.0, 1.0, math.nan, 3.0, -2.0]), fd=False)
case("binary-logaddexp", lambda e, F, a, b: e.logaddexp(a, b), N(3, 1), N(4))
case("binary-xlogy", lambda e, F, a, b: e.xlogy(a, b), N(3, 4), U(0.3, 2.0, 4))
case("binary-lerp", lambda e, F, a, b, w: e.lerp(a, b, w), N(3, 4), N(4), U(0, 1, 3, 1))
case("binary-inplace-chain", lambda e, F, a, b: a.clone().mul_(b).add_(a).div_(2.0), N(3, 4), N(4))

# -- where / clamp -------------------------------------------------------------------------------------------
_COND = np.array([[True], [False], [True]])
case("where-broadcast", lambda e, F, a, b: e.where(e.tensor(_COND), a, b), N(3, 4), N(4))
case("where-scalar", lambda e, F, a: e.where(a > 0, a, 0.5), NZ(3, 4))
case("where-method-noncontiguous", lambda e, F, a, b: a.T.where(e.tensor(_COND), b.T), N(4, 3), N(4, 3))
case("clamp-scalars", lambda e, F, x: e.clamp(x, -0.5, 0.7), N(3, 4))
case("clamp-min-only", lambda e, F, x: x.clamp(min=-0.3), N(3, 4))
case("clamp-max-only", lambda e, F, x: x.clamp_max(0.2), N(3, 4))
case("clamp-tensors", lambda e, F, x, lo, hi: e.clamp(x, lo, hi), N(3, 4), -np.abs(N(4)) - 0.1, np.abs(N(4)) + 0.1)
case("clamp-noncontiguous", lambda e, F, x: x.T.clip(-0.4, 0.4), N(4, 3))

# -- reductions ------------------------------------------------------------------------------------------------
_X3 = N(2, 3, 4)
_PROD_ZEROS = np.array([[1.5, 0.0, -2.0, 0.7], [0.0, 0.0, 1.3, 2.0], [0.5, -1.2, 1.1, 0.9]])
case("sum-all", lambda e, F, x: x.sum(), _X3)
case("sum-dim", lambda e, F, x: e.sum(x, 1), _X3)
case("sum-dims-keepdim", lambda e, F, x: x.sum((0, 2), keepdim=True), _X3)
case("sum-noncontiguous", lambda e, F, x: x.permute(2, 0, 1)[:, :, ::2].sum(-1), _X3)
case("nansum", lambda e, F, x: e.nansum(x, 1), N(3, 4))
case("mean-all", lambda e, F, x: x.mean(), _X3)
case("mean-dim-keepdim", lambda e, F, x: e.mean(x, dim=1, keepdim=True), _X3)
case("nanmean", lambda e, F, x: e.nanmean(x, 0), N(3, 4))
case("prod-all", lambda e, F, x: x.prod(), NZ(3, 4))
case("prod-dim", lambda e, F, x: e.prod(x, 1), NZ(3, 4))
case("prod-with-zeros", lambda e, F, x: e.prod(x, 1), _PROD_ZEROS)
case("prod-all-one-zero", lambda e, F, x: x.prod(), _PROD_ZEROS[[0, 2]])
case("amax-dim", lambda e, F, x: e.amax(x, 1), _X3)
case("amax-dims", lambda e, F, x: x.amax((0, 2), keepdim=True), _X3)
case("amin-all", lambda e, F, x: e.amin(x), N(3, 4))
case("amin-dim", lambda e, F, x: x.amin(-1), _X3)
case("aminmax", lambda e, F, x: tuple(e.aminmax(x, dim=1)), N(3, 4))
case("max-all", lambda e, F, x: x.max(), N(3, 4))
case("max-dim", lambda e, F, x: e.max(x, dim=1).values, _X3)
case("min-all", lambda e, F, x: e.min(x), N(3, 4))
case("min-dim-keepdim", lambda e, F, x: x.min(0, keepdim=True).values, _X3)
_TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, 5.0, 0.0, 5.0]])
case("amax-ties", lambda e, F, x: e.amax(x, 1), _TIES, fd=False)
case("amin-ties-all", lambda e, F, x: e.amin(x), np.array([[1.0, 0.0], [0.0, 2.0]]), fd=False)
case("max-all-ties", lambda e, F, x: x.max(), _TIES, fd=False)
case("max-dim-ties", lambda e, F, x: x.max(1).values, _TIES, fd=False)
case("min-dim-ties", lambda e, F, x: x.min(0).values, _TIES, fd=False)
case("var-dim", lambda e, F, x: e.var(x, 1), _X3)
case("var-all", lambda e, F, x: x.var(), N(3, 4))
case("var-correction0-keepdim", lambda e, F, x: x.var(dim=(0, 2), keepdim=True, correction=0), _X3)
case("std-dim", lambda e, F, x: e.std(x, dim=0), N(3, 4))
case("std-all-unbiased-false", lambda e, F, x: x.std(unbiased=False), N(3, 4))
case("var_mean", lambda e, F, x: tuple(e.var_mean(x, 1)), N(3, 4))
case("std_mean", lambda e, F, x: tuple(e.std_mean(x, 0)), N(3, 4))
case("logsumexp-dim", lambda e, F, x: e.logsumexp(x, 1), _X3)
case("logsumexp-dims-keepdim", lambda e, F, x: x.logsumexp((0, 1), keepdim=True), _X3)
case("cumsum", lambda e, F, x: e.cumsum(x, 1), N(3, 4))
case("cumsum-noncontiguous", lambda e, F, x: x.T.cumsum(0), N(3, 4))
case("cumprod", lambda e, F, x: x.cumprod(dim=1), NZ(3, 4))
case("cumprod-with-zeros", lambda e, F, x: e.cumprod(x, 1), _PROD_ZEROS)
case("cummax", lambda e, F, x: e.cummax(x, 1).values, N(3, 4))
case("cummin", lambda e, F, x: x.cummin(0).values, N(3, 4))
case("norm-fro", lambda e, F, x: e.norm(x), N(3, 4))
case("norm-p1-dim", lambda e, F, x: x.norm(p=1, dim=1), NZ(3, 4))
case("norm-p3-dim", lambda e, F, x: e.norm(x, p=3, dim=0, keepdim=True), N(3, 4))
case("norm-inf-dim", lambda e, F, x: e.norm(x, p=math.inf, dim=1), N(3, 4))
case("vector_norm", lambda e, F, x: e.linalg.vector_norm(x, 2, dim=(0, 2)), _X3)
case("vector_norm-ord-half", lambda e, F, x: e.linalg.vector_norm(x, ord=0.5, dim=1), NZ(3, 4))
case("vector_norm-neg-inf", lambda e, F, x: e.linalg.vector_norm(x, ord=-math.inf), N(3, 4))
case("median-dim", lambda e, F, x: e.median(x, 1).values, N(3, 5))
case("median-all", lambda e, F, x: x.median(), N(3, 5))
case("kthvalue", lambda e, F, x: e.kthvalue(x, 2, 1).values, N(3, 5))

# -- sort / topk values ---------------------------------------------------------------------------------------
case("sort-values", lambda e, F, x: e.sort(x, dim=1).values, N(3, 5))
case("sort-descending-dim0", lambda e, F, x: x.sort(dim=0, descending=True).values, N(3, 5))
case("sort-noncontiguous", lambda e, F, x: x.T.sort(-1)[0], N(3, 5))
case("topk-values", lambda e, F, x: e.topk(x, 2, dim=1).values, N(3, 5))
case("topk-smallest-dim0", lambda e, F, x: x.topk(2, 0, largest=False).values, N(3, 5))
case("topk-unsorted-sum", lambda e, F, x: x.topk(3, sorted=False).values.sum(-1), N(3, 5))

# -- movement --------------------------------------------------------------------------------------------------
case("reshape", lambda e, F, x: x.reshape(4, 6) * e.tensor(np.arange(24.0).reshape(4, 6)), _X3)
case("reshape-noncontiguous", lambda e, F, x: e.reshape(x.transpose(0, 2), (-1, 2)), _X3)
case("view", lambda e, F, x: x.view(6, 4).sin(), _X3)
case("view_as-reshape_as", lambda e, F, x, y: x.view_as(y) + x.reshape_as(y), N(3, 4), N(4, 3))
case("permute", lambda e, F, x: e.permute(x, (2, 0, 1)), _X3)
case("transpose", lambda e, F, x: x.transpose(0, 2), _X3)
case("T-mT-t", lambda e, F, x: (x.T, x.t(), x.mT), N(3, 4))
case("swapaxes-movedim", lambda e, F, x: (e.swapaxes(x, 0, 1), e.movedim(x, 0, 2)), _X3)
case("expand", lambda e, F, x: x.expand(2, 3, 4), N(3, 1))
case("expand-minus-one", lambda e, F, x: x.expand(2, -1, 4), N(1, 3, 1))
case("expand_as-broadcast_to", lambda e, F, x, y: (x.expand_as(y), e.broadcast_to(x, (2, 3, 4))), N(4), _X3)
case("repeat", lambda e, F, x: x.repeat(2, 1, 2), N(3, 2))
case("tile", lambda e, F, x: e.tile(x, (2, 2)), N(2, 3))
case("flip", lambda e, F, x: e.flip(x, (0, 2)), _X3)
case("fliplr-flipud", lambda e, F, x: (e.fliplr(x), e.flipud(x)), N(3, 4))
case("roll", lambda e, F, x: e.roll(x, 1, 1), _X3)
case("roll-dims", lambda e, F, x: x.roll((1, -1), (0, 2)), _X3)
case("roll-flat", lambda e, F, x: x.roll(5), N(3, 4))
case("cat", lambda e, F, a, b: e.cat([a, b], dim=1), N(2, 3), N(2, 2))
case("cat-noncontiguous", lambda e, F, a, b: e.cat([a.T, b[:, ::2]], 1), N(3, 2), N(2, 4))
case("cat-same-input", lambda e, F, a: e.cat([a, a * 2, a], -1), N(2, 3))
case("stack", lambda e, F, a, b: e.stack([a, b], dim=1), N(2, 3), N(2, 3))
case("hstack-vstack", lambda e, F, a, b: (e.hstack([a, b]), e.vstack([a, b])), N(2, 3), N(2, 3))
case("split-sizes", lambda e, F, x: tuple(e.split(x, [1, 2], dim=1)), _X3)
case("split-int", lambda e, F, x: tuple(x.split(3, -1)), N(2, 7))
case("chunk", lambda e, F, x: tuple(x.chunk(2, dim=2)), _X3)
case("unbind", lambda e, F, x: tuple(e.unbind(x, 1)), N(2, 3))
case("tensor_split", lambda e, F, x: tuple(x.tensor_split([1, 3], dim=1)), N(2, 5))
case("squeeze", lambda e, F, x: (x.squeeze(1), e.squeeze(x)), N(3, 1, 4))
case("unsqueeze", lambda e, F, x: (x.unsqueeze(1), e.unsqueeze(x, -1)), N(3, 4))
case("flatten", lambda e, F, x: (x.flatten(1), e.flatten(x), x.ravel()), _X3)
case("unflatten", lambda e, F, x: x.unflatten(1, (2, 2)), N(3, 4))
case("narrow-select", lambda e, F, x: (x.narrow(1, 1, 2), x.select(0, 1)), N(3, 4))
case("tril", lambda e, F, x: e.tril(x), N(4, 4))
case("triu-diagonal", lambda e, F, x: (x.triu(1), e.tril(x, -1)), N(2, 3, 4))
case("unfold", lambda e, F, x: x.unfold(2, 2, 1), _X3)
case("unfold-step", lambda e, F, x: x.unfold(0, 2, 2), N(5, 3))
case("diagonal-diag", lambda e, F, x: (e.diagonal(x, 1), e.diag(x)), N(3, 4))
case("diag-embed", lambda e, F, x: (e.diag(x), e.diag_embed(x)), N(4))
case("contiguous-clone", lambda e, F, x: (x.T.contiguous(), x.clone()), N(3, 4))



def _inplace_chain(e: Any, F: Any, x: Any, src: Any, w: Any) -> Any:  # noqa: N803 - F as in torch.nn.functional
    """In-place ops on non-leaf tensors: the history is rebased onto each op (PyTorch's semantics)."""
    y = x * 1.0
    y.add_(0.5)
    y.masked_fill_(e.tensor(_MASK), 0.3)
    y.scatter_(1, e.tensor(_SIDX), src)
    y.index_add_(0, e.tensor(I(1, 1)), src[:2, :1].expand(2, 5) * 0.5)
    y.mul_(2.0)
    z = w * 1.0
    z[1:3] = y[1:3]
    z.copy_(z * 2.0)  # the product saves nothing of z that backward reads: the in-place copy is fine
    z.sub_(y.exp())
    return z + y.sigmoid()


def _inplace_reading_input(e: Any, F: Any, x: Any) -> Any:  # noqa: N803 - F as in torch.nn.functional
    """In-place ops whose gradient reads the value they overwrite (PyTorch keeps the original for backward)."""
    y = x * 1.0
    y.sin_()
    y.abs_()
    y.clamp_(-0.6, 0.6)
    F.elu(y.sub_(0.3), inplace=True)
    z = x * 2.0
    F.relu(z, inplace=True)
    return y, z


# -- indexing: get -----------------------------------------------------------------------------------------------
_X = N(4, 5)
_IDX_DUP = I(0, 2, 0, 3)
_MASK = np.array([[True, False, True, True, False], [False, False, True, False, True],
                  [True, True, False, False, False], [False, True, False, True, True]])
case("getitem-int", lambda e, F, x: x[1], _X)
case("getitem-negative-int-pair", lambda e, F, x: x[-1, 2], _X)
case("getitem-slices", lambda e, F, x: x[:, 1:4], _X)
case("getitem-step-ellipsis-none", lambda e, F, x: x[..., ::2][None, 1:], _X)
case("getitem-index-dups", lambda e, F, x: x[e.tensor(_IDX_DUP)], _X)
case("getitem-list-dups", lambda e, F, x: x[:, [4, 1, 4]], _X)
case("getitem-advanced-pair", lambda e, F, x: x[e.tensor(I(0, 3, 0)), e.tensor(I(1, 1, 1))], _X)
case("getitem-int-and-index", lambda e, F, x: x[2, e.tensor(I(0, 0, 4))], _X)
case("getitem-mask", lambda e, F, x: x[e.tensor(_MASK)], _X)
case("getitem-row-mask", lambda e, F, x: x[e.tensor(np.array([True, False, True, True]))], _X)
case("getitem-noncontiguous", lambda e, F, x: x.T[1:, e.tensor(I(3, 3))], _X)
case("take-take_along_dim", lambda e, F, x: (e.take(x, e.tensor(I(0, 19, 0))),
                                             e.take_along_dim(x, e.tensor(I(0, 4, 4)[None].repeat(4, 0)), 1)), _X)
case("masked_select", lambda e, F, x: e.masked_select(x, e.tensor(_MASK)), _X)

# -- indexing: set (on a clone of a leaf; gradients to the clone's source and to the value) ----------------------


def _set(key: Callable[[Any], Any]) -> Fn:
    def fn(e: Any, F: Any, x: Any, v: Any) -> Any:  # noqa: N803 - F as in torch.nn.functional
        y = x * 1.5
        y[key(e)] = v
        return y

    return fn


case("setitem-int", _set(lambda e: 1), _X, N(5))
case("setitem-slices", _set(lambda e: (slice(None), slice(1, 3))), _X, N(4, 2))
case("setitem-broadcast-value", _set(lambda e: slice(1, 3)), _X, N(5))
case("setitem-index", _set(lambda e: e.tensor(I(3, 0))), _X, N(2, 5))
case("setitem-advanced-pair", _set(lambda e: (e.tensor(I(0, 2, 3)), e.tensor(I(4, 1, 1)))), _X, N(3))
case("setitem-mask", _set(lambda e: e.tensor(_MASK)), _X, N(int(_MASK.sum())))


def _set_mask_scalar(e: Any, F: Any, x: Any) -> Any:  # noqa: N803 - F as in torch.nn.functional
    y = x * 2
    y[e.tensor(_MASK)] = 0.5
    return y


case("setitem-mask-scalar-value", _set_mask_scalar, _X)
case("setitem-step-ellipsis", _set(lambda e: (Ellipsis, slice(None, None, 2))), _X, N(4, 3))
case("index_put", lambda e, F, x, v: x.index_put((e.tensor(I(0, 2)), e.tensor(I(1, 3))), v), _X, N(2))
case("index_put-accumulate-dups", lambda e, F, x, v: x.index_put((e.tensor(I(0, 0, 2)),), v, accumulate=True),
     _X, N(3, 5))

# -- gather / scatter / index_select / masked_fill ------------------------------------------------------------
_GIDX = I(0, 4, 4, 1, 2, 2, 3, 0, 0, 1, 1, 1).reshape(4, 3)
_SIDX = np.stack([np.random.default_rng(s).permutation(5)[:2] for s in range(4)]).astype(np.int64)
case("gather-dups", lambda e, F, x: e.gather(x, 1, e.tensor(_GIDX)), _X)
case("gather-dim0", lambda e, F, x: x.gather(0, e.tensor(_GIDX.T[:, :4] % 4)), _X)
case("gather-noncontiguous", lambda e, F, x: x.T.gather(0, e.tensor(_GIDX.T % 4)), _X)
case("scatter-src", lambda e, F, x, s: e.scatter(x, 1, e.tensor(_SIDX), s), _X, N(4, 2))
case("scatter-value", lambda e, F, x: x.scatter(1, e.tensor(_SIDX), 0.25), _X)
case("scatter_add-dups", lambda e, F, x, s: e.scatter_add(x, 1, e.tensor(_GIDX), s), _X, N(4, 3))
case("index_select-dups", lambda e, F, x: e.index_select(x, 0, e.tensor(_IDX_DUP)), _X)
case("index_select-dim1", lambda e, F, x: x.index_select(1, e.tensor(I(4, 4, 0))), _X)
case("index_add-dups", lambda e, F, x, s: x.index_add(0, e.tensor(I(1, 1, 3)), s, alpha=2.0), _X, N(3, 5))
case("masked_fill", lambda e, F, x: e.masked_fill(x, e.tensor(_MASK), 0.5), _X)
case("inplace-ops-on-non-leaf", _inplace_chain, N(4, 5), N(4, 2), N(4, 5))
case("inplace-ops-reading-their-input", _inplace_reading_input, N(3, 4))
case("cast-roundtrip", lambda e, F, x: (x.float() * 3).double() + x.to(e.float32).to(e.float64), N(3, 4), fd=False)
case("masked_fill-broadcast-mask", lambda e, F, x: x.masked_fill(e.tensor(_MASK[0]), -1.0), _X)

# -- matmul (every rank combination), bmm, einsum ---------------------------------------------------------------
_MM_SHAPES = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((2, 2, 3), (3,)), ((3,), (2, 3, 4)),
              ((2, 2, 3), (3, 4)), ((2, 3), (2, 3, 4)), ((2, 2, 3), (2, 3, 2)), ((2, 1, 2, 3), (3, 3, 2))]
for _sa, _sb in _MM_SHAPES:
    case(f"matmul-{_sa}-{_sb}".replace(" ", ""), lambda e, F, a, b: e.matmul(a, b), N(*_sa), N(*_sb))
case("matmul-operator-noncontiguous", lambda e, F, a, b: a.T @ b[:, ::2], N(3, 2), N(3, 6))
case("matmul-same-input", lambda e, F, a: a @ a.T, N(3, 4))
case("mm-mv-dot", lambda e, F, a, b, c: (e.mm(a, b), e.mv(a, c), e.dot(c, c)), N(2, 3), N(3, 2), N(3))
case("outer-inner", lambda e, F, a, b: (e.outer(a, b), e.inner(a, b)), N(3), N(3))
case("tensordot", lambda e, F, a, b: e.tensordot(a, b, dims=([1, 2], [0, 1])), N(2, 3, 2), N(3, 2, 2))
case("bmm", lambda e, F, a, b: e.bmm(a, b), N(2, 2, 3), N(2, 3, 2))
case("bmm-noncontiguous", lambda e, F, a, b: a.bmm(b.transpose(1, 2)), N(2, 2, 3), N(2, 2, 3))
for _eq, _shapes in [("ij,jk->ik", ((2, 3), (3, 4))), ("bij,bjk->bik", ((2, 2, 3), (2, 3, 2))),
                     ("ij->j", ((3, 4),)), ("ii->i", ((3, 3),)), ("i,j->ij", ((3,), (4,))),
                     ("bij,jk->bk", ((2, 2, 3), (3, 2))), ("ijk->kji", ((2, 3, 4),)), ("i,i->", ((4,), (4,))),
                     ("...ij,...jk", ((2, 2, 3), (3, 2))), ("ij,ij,ij->i", ((2, 3), (2, 3), (2, 3)))]:
    case(f"einsum-{_eq}", lambda e, F, *xs, eq=_eq: e.einsum(eq, *xs), *[N(*s) for s in _shapes])

# -- nn.functional: activations ----------------------------------------------------------------------------------
_ACT = N(3, 4, scale=2.0)
for _name, _fn in [
    ("relu", lambda e, F, x: F.relu(x)),
    ("relu6", lambda e, F, x: F.relu6(x * 4)),
    ("hardtanh", lambda e, F, x: F.hardtanh(x, -0.5, 1.0)),
    ("gelu", lambda e, F, x: F.gelu(x)),
    ("gelu-tanh", lambda e, F, x: F.gelu(x, approximate="tanh")),
    ("silu", lambda e, F, x: F.silu(x)),
    ("elu", lambda e, F, x: F.elu(x)),
    ("elu-alpha", lambda e, F, x: F.elu(x, alpha=0.5)),
    ("selu-celu", lambda e, F, x: (F.selu(x), F.celu(x, 0.7))),
    ("leaky_relu", lambda e, F, x: F.leaky_relu(x, 0.1)),
    ("softplus", lambda e, F, x: F.softplus(x)),
    ("softplus-beta-threshold", lambda e, F, x: F.softplus(x, beta=2.0, threshold=1.0)),
    ("mish", lambda e, F, x: F.mish(x)),
    ("hardswish", lambda e, F, x: F.hardswish(x)),
    ("hardsigmoid", lambda e, F, x: F.hardsigmoid(x * 2)),
    ("sigmoid", lambda e, F, x: F.sigmoid(x)),
    ("tanh", lambda e, F, x: F.tanh(x)),
    ("logsigmoid-softsign-tanhshrink", lambda e, F, x: (F.logsigmoid(x), F.softsign(x), F.tanhshrink(x))),
    ("shrinks-threshold", lambda e, F, x: (F.hardshrink(x, 0.5), F.softshrink(x, 0.5), F.threshold(x, 0.2, -1.0))),
    ("softmax", lambda e, F, x: F.softmax(x, dim=1)),
    ("softmax-dim0-noncontiguous", lambda e, F, x: F.softmax(x.T, dim=0)),
    ("log_softmax", lambda e, F, x: F.log_softmax(x, dim=1)),
    ("log_softmax-dim0", lambda e, F, x: F.log_softmax(x, 0)),
    ("softmin", lambda e, F, x: F.softmin(x, dim=-1)),
    ("glu", lambda e, F, x: F.glu(x, -1)),
    ("normalize", lambda e, F, x: F.normalize(x, dim=1)),
]:
    case(f"F.{_name}", _fn, _ACT)
case("F.prelu", lambda e, F, x, w: F.prelu(x, w), N(2, 3, 4, scale=2.0), N(3))
case("F.cosine_similarity", lambda e, F, a, b: F.cosine_similarity(a, b, dim=1), N(3, 4), N(1, 4))
case("F.pairwise_distance", lambda e, F, a, b: F.pairwise_distance(a, b), N(3, 4), N(3, 4))

# -- nn.functional: linear, conv, conv_transpose ------------------------------------------------------------------
case("F.linear", lambda e, F, x, w, b: F.linear(x, w, b), N(2, 3), N(4, 3), N(4))
case("F.linear-3d-nobias", lambda e, F, x, w: F.linear(x, w), N(2, 2, 3), N(4, 3))
case("F.bilinear", lambda e, F, a, b, w, bias: F.bilinear(a, b, w, bias), N(2, 3), N(2, 2), N(2, 3, 2), N(2))
case("F.conv1d", lambda e, F, x, w, b: F.conv1d(x, w, b), N(2, 2, 7), N(3, 2, 3), N(3))
case("F.conv1d-stride-pad-dil-groups",
     lambda e, F, x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2), N(1, 4, 8), N(4, 2, 2), N(4))
case("F.conv2d", lambda e, F, x, w, b: F.conv2d(x, w, b), N(1, 2, 5, 5), N(3, 2, 3, 3), N(3))
case("F.conv2d-stride-pad-groups", lambda e, F, x, w: F.conv2d(x, w, stride=2, padding=1, groups=2),
     N(2, 2, 5, 4), N(4, 1, 2, 2))
case("F.conv2d-dilation-asym-pad", lambda e, F, x, w, b: F.conv2d(x, w, b, padding=(1, 2), dilation=2),
     N(1, 1, 6, 6), N(2, 1, 2, 2), N(2))
case("F.conv2d-same", lambda e, F, x, w: F.conv2d(x, w, padding="same", dilation=(1, 2)), N(1, 2, 4, 5),
     N(2, 2, 3, 3))
case("F.conv2d-noncontiguous", lambda e, F, x, w: F.conv2d(x.transpose(2, 3), w), N(1, 2, 5, 4), N(2, 2, 2, 2))
case("F.conv3d", lambda e, F, x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=1),
     N(1, 1, 3, 4, 4), N(2, 1, 2, 2, 2), N(2))
case("F.conv_transpose1d", lambda e, F, x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1),
     N(1, 2, 4), N(2, 3, 3), N(3))
case("F.conv_transpose1d-groups-dilation", lambda e, F, x, w: F.conv_transpose1d(x, w, groups=2, dilation=2),
     N(2, 2, 4), N(2, 1, 2))
case("F.conv_transpose2d", lambda e, F, x, w, b: F.conv_transpose2d(x, w, b, stride=2), N(1, 2, 3, 3),
     N(2, 2, 2, 2), N(2))
case("F.conv_transpose2d-all-options",
     lambda e, F, x, w, b: F.conv_transpose2d(x, w, b, stride=(2, 1), padding=1, output_padding=(1, 0), groups=2,
                                              dilation=(1, 2)), N(1, 2, 3, 3), N(2, 1, 3, 2), N(2))

case("F.conv_transpose3d", lambda e, F, x, w, b: F.conv_transpose3d(x, w, b, stride=(2, 1, 1), padding=(0, 1, 0)),
     N(1, 2, 2, 2, 3), N(2, 1, 2, 3, 2), N(1))

# -- nn.functional: pools, interpolate, pad ----------------------------------------------------------------------
_IMG = N(1, 2, 5, 5)
case("F.max_pool1d", lambda e, F, x: F.max_pool1d(x, 3, 2, 1), N(1, 2, 7))
case("F.max_pool2d", lambda e, F, x: F.max_pool2d(x, 2), _IMG)
case("F.max_pool2d-stride-pad-ceil", lambda e, F, x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), _IMG)
case("F.max_pool2d-dilation", lambda e, F, x: F.max_pool2d(x, 2, stride=1, dilation=2), _IMG)
case("F.max_pool2d-noncontiguous", lambda e, F, x: F.max_pool2d(x.transpose(2, 3)[..., ::2], (2, 1)), _IMG)
case("F.max_pool3d", lambda e, F, x: F.max_pool3d(x, 2), N(1, 1, 4, 4, 3))
case("F.max_pool2d-ties", lambda e, F, x: F.max_pool2d(x, 2, stride=1), np.array([[[[1.0, 1.0, 0.0],
                                                                                   [1.0, 0.5, 2.0],
                                                                                   [0.0, 2.0, 2.0]]]]), fd=False)
case("F.avg_pool1d", lambda e, F, x: F.avg_pool1d(x, 3, 2, 1, count_include_pad=False), N(1, 2, 7))
case("F.avg_pool2d", lambda e, F, x: F.avg_pool2d(x, 2), _IMG)
case("F.avg_pool2d-pad-ceil", lambda e, F, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), _IMG)
case("F.avg_pool2d-divisor", lambda e, F, x: F.avg_pool2d(x, 2, 1, divisor_override=3), _IMG)
case("F.avg_pool3d", lambda e, F, x: F.avg_pool3d(x, 2, stride=1), N(1, 1, 3, 3, 3))
case("F.adaptive_avg_pool1d", lambda e, F, x: F.adaptive_avg_pool1d(x, 3), N(1, 2, 7))
case("F.adaptive_avg_pool2d", lambda e, F, x: F.adaptive_avg_pool2d(x, (2, 3)), _IMG)
case("F.adaptive_avg_pool3d", lambda e, F, x: F.adaptive_avg_pool3d(x, 2), N(1, 1, 3, 3, 3))
case("F.adaptive_max_pool1d", lambda e, F, x: F.adaptive_max_pool1d(x, 3), N(1, 2, 7))
case("F.adaptive_max_pool2d", lambda e, F, x: F.adaptive_max_pool2d(x, (2, 3)), _IMG)
case("F.adaptive_max_pool3d", lambda e, F, x: F.adaptive_max_pool3d(x, 2), N(1, 1, 3, 3, 3))
_SMALL_IMG = N(1, 2, 3, 4)
for _mode, _kw in [("nearest", {"size": (5, 7)}), ("nearest", {"scale_factor": 2}),
                   ("nearest-exact", {"size": (5, 3)}),
                   ("bilinear", {"size": (5, 6)}), ("bilinear", {"size": (5, 6), "align_corners": True}),
                   ("bilinear", {"size": (2, 3)}), ("bicubic", {"size": (5, 6)}),
                   ("bicubic", {"scale_factor": 1.5, "align_corners": True})]:
    case(f"F.interpolate-{_mode}-{'-'.join(f'{k}={v}' for k, v in _kw.items())}",
         lambda e, F, x, m=_mode, kw=_kw: F.interpolate(x, mode=m, **kw), _SMALL_IMG)
case("F.interpolate-linear", lambda e, F, x: F.interpolate(x, size=7, mode="linear"), N(1, 2, 4))
case("F.interpolate-nearest-1d", lambda e, F, x: F.interpolate(x, scale_factor=2), N(1, 2, 4))
case("F.interpolate-trilinear", lambda e, F, x: F.interpolate(x, size=(3, 3, 4), mode="trilinear"), N(1, 1, 2, 2, 3))
for _mode, _pads in [("constant", (1, 2)), ("constant", (1, 1, 2, 0)), ("reflect", (2, 1, 1, 2)),
                     ("replicate", (2, 1, 1, 3)), ("circular", (1, 2, 2, 1))]:
    case(f"F.pad-{_mode}-{_pads}".replace(" ", ""),
         lambda e, F, x, m=_mode, p=_pads: F.pad(x, p, mode=m, **({"value": 0.5} if m == "constant" else {})),
         _SMALL_IMG)
case("F.unfold-fold", lambda e, F, x: (F.unfold(x, 2, padding=1, stride=2), F.fold(F.unfold(x, 2), (4, 4), 2)),
     N(1, 2, 4, 4))
case("F.pixel_shuffle-unshuffle", lambda e, F, x: (F.pixel_shuffle(x, 2), F.pixel_unshuffle(x, 2)), N(1, 4, 2, 4))
case("F.pad-negative", lambda e, F, x: F.pad(x, (-1, 1)), N(2, 5))

# -- nn.functional: embedding, norms -------------------------------------------------------------------------------
_TOKENS = I(1, 3, 1, 0, 4, 1).reshape(2, 3)
case("F.embedding", lambda e, F, w: F.embedding(e.tensor(_TOKENS), w), N(5, 3))
# padding_idx: the forward is unchanged, the padding row gets no gradient by convention (torch only, no differences)
case("F.embedding-padding_idx", lambda e, F, w: F.embedding(e.tensor(_TOKENS), w, padding_idx=1), N(5, 3), fd=False)
case("F.layer_norm", lambda e, F, x, w, b: F.layer_norm(x, (4,), w, b), N(2, 3, 4), N(4), N(4))
case("F.layer_norm-2d-noaffine", lambda e, F, x: F.layer_norm(x, (3, 4)), N(2, 3, 4))
case("F.rms_norm", lambda e, F, x, w: F.rms_norm(x, (4,), w), N(2, 3, 4), N(4))
case("F.batch_norm-training", lambda e, F, x, w, b: F.batch_norm(x, None, None, w, b, training=True),
     N(4, 3), N(3), N(3))
case("F.batch_norm-training-running-stats",
     lambda e, F, x, w, b: F.batch_norm(x, e.zeros(3, dtype=e.float64), e.ones(3, dtype=e.float64), w, b,
                                        training=True, momentum=0.2),
     N(2, 3, 2, 2), N(3), N(3))
case("F.batch_norm-eval", lambda e, F, x, w, b: F.batch_norm(x, e.tensor(np.array([0.1, -0.2, 0.3])),
                                                              e.tensor(np.array([1.5, 0.5, 2.0])), w, b),
     N(2, 3, 2), N(3), N(3))
case("F.group_norm", lambda e, F, x, w, b: F.group_norm(x, 2, w, b), N(2, 4, 3), N(4), N(4))
case("F.group_norm-noaffine", lambda e, F, x: F.group_norm(x, 1), N(2, 2, 2, 3))
case("F.instance_norm", lambda e, F, x, w, b: F.instance_norm(x, weight=w, bias=b), N(2, 3, 4), N(3), N(3))

# -- nn.functional: attention ------------------------------------------------------------------------------------
_CAUSAL_MASK = np.tril(np.ones((3, 5), dtype=bool), 2)
case("F.sdpa", lambda e, F, q, k, v: F.scaled_dot_product_attention(q, k, v), N(1, 2, 3, 4), N(1, 2, 5, 4),
     N(1, 2, 5, 3))
case("F.sdpa-bool-mask", lambda e, F, q, k, v: F.scaled_dot_product_attention(q, k, v, e.tensor(_CAUSAL_MASK)),
     N(1, 2, 3, 4), N(1, 2, 5, 4), N(1, 2, 5, 3))
case("F.sdpa-float-mask-scale", lambda e, F, q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=0.5),
     N(2, 3, 4), N(2, 5, 4), N(2, 5, 3), N(3, 5))
case("F.sdpa-causal", lambda e, F, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     N(1, 2, 3, 4), N(1, 2, 3, 4), N(1, 2, 3, 2))

# -- nn.functional: losses ---------------------------------------------------------------------------------------
_T5 = I(0, 3, 2, 4)
_W5 = np.array([0.5, 1.0, 2.0, 0.3, 1.5])
for _name, _fn in [
    ("cross_entropy", lambda e, F, x: F.cross_entropy(x, e.tensor(_T5))),
    ("cross_entropy-sum", lambda e, F, x: F.cross_entropy(x, e.tensor(_T5), reduction="sum")),
    ("cross_entropy-none", lambda e, F, x: F.cross_entropy(x, e.tensor(_T5), reduction="none")),
    ("cross_entropy-weight", lambda e, F, x: F.cross_entropy(x, e.tensor(_T5), e.tensor(_W5))),
    ("cross_entropy-ignore_index", lambda e, F, x: F.cross_entropy(x, e.tensor(_T5), ignore_index=2)),
    ("cross_entropy-label_smoothing", lambda e, F, x: F.cross_entropy(x, e.tensor(_T5), label_smoothing=0.1)),
    ("cross_entropy-all-options", lambda e, F, x: F.cross_entropy(x, e.tensor(_T5), e.tensor(_W5), ignore_index=3,
                                                                  label_smoothing=0.2)),
    ("nll_loss", lambda e, F, x: F.nll_loss(x, e.tensor(_T5))),
    ("nll_loss-weight-ignore", lambda e, F, x: F.nll_loss(x, e.tensor(_T5), e.tensor(_W5), ignore_index=0)),
    ("nll_loss-none", lambda e, F, x: F.nll_loss(x, e.tensor(_T5), reduction="none")),
]:
    case(f"F.{_name}", _fn, N(4, 5))
case("F.cross_entropy-spatial", lambda e, F, x: F.cross_entropy(x, e.tensor(I(0, 2, 1, 1, 2, 0, 0, 1)
                                                                            .reshape(2, 2, 2))), N(2, 3, 2, 2))
case("F.cross_entropy-probabilities", lambda e, F, x, p: F.cross_entropy(x, F.softmax(p, 1), label_smoothing=0.1),
     N(4, 5), N(4, 5))
case("F.mse_loss", lambda e, F, a, b: F.mse_loss(a, b), N(3, 4), N(3, 4))
case("F.mse_loss-none", lambda e, F, a, b: F.mse_loss(a, b, reduction="none"), N(3, 4), N(3, 4))
case("F.l1_loss", lambda e, F, a, b: F.l1_loss(a, b), N(3, 4), N(3, 4))
case("F.smooth_l1_loss", lambda e, F, a, b: F.smooth_l1_loss(a, b, beta=0.5), N(3, 4), N(3, 4))
case("F.huber_loss", lambda e, F, a, b: F.huber_loss(a, b, reduction="sum", delta=0.7), N(3, 4), N(3, 4))
_PROB_T = U(0.0, 1.0, 3, 4)
case("F.binary_cross_entropy", lambda e, F, p: F.binary_cross_entropy(p, e.tensor(_PROB_T)), U(0.05, 0.95, 3, 4))
case("F.binary_cross_entropy-weight",
     lambda e, F, p: F.binary_cross_entropy(p, e.tensor(_PROB_T), e.tensor(_W5[:4]), reduction="sum"),
     U(0.05, 0.95, 3, 4))
case("F.binary_cross_entropy_with_logits", lambda e, F, x, t: F.binary_cross_entropy_with_logits(x, t),
     N(3, 4), U(0, 1, 3, 4))
case("F.binary_cross_entropy_with_logits-pos_weight-weight",
     lambda e, F, x: F.binary_cross_entropy_with_logits(x, e.tensor(_PROB_T), e.tensor(_W5[:4]),
                                                        pos_weight=e.tensor(_W5[1:])), N(3, 4))
case("F.kl_div", lambda e, F, x, t: F.kl_div(F.log_softmax(x, 1), t, reduction="batchmean"), N(3, 4), U(0.1, 1, 3, 4))
case("F.kl_div-log_target", lambda e, F, x, t: F.kl_div(x, t, reduction="sum", log_target=True), N(3, 4), N(3, 4))


def _case_id(c: Case) -> str:
    return c.id


@pytest.mark.parametrize("c", CASES, ids=_case_id)
def test_gradient(f64: Any, c: Case) -> None:
    """Backward against finite differences and against torch autograd."""
    run_case(c)


def test_every_differentiable_unary_op_has_cases() -> None:
    ids = {c.id for c in CASES}
    for op in DIFFERENTIABLE_UNARY:
        assert f"unary-{op}" in ids and f"unary-{op}-noncontiguous" in ids, op


@pytest.mark.parametrize("p", [0.0, 0.4])
@pytest.mark.parametrize("op", ["dropout", "dropout1d", "dropout2d"])
def test_dropout_gradient_is_the_mask(f64: Any, op: str, p: float) -> None:
    """With a fixed seed dropout is a fixed linear map: gradient = cotangent * mask / (1 - p)."""
    x = N(2, 3, 4)

    def fn(e: Any, F: Any, t: Any) -> Any:  # noqa: N803 - F as in torch.nn.functional
        f64.seed(7)  # the same mask on every call, so finite differences see a fixed map
        return getattr(F, op)(t, p, training=True)

    grads, ws = ember_grads(fn, [x])
    with ember.no_grad():
        y = fn(ember, EF, ember.tensor(x)).numpy()
    mask = y != 0
    if op != "dropout":  # whole channels: the mask is constant along the length
        assert np.all(mask == mask[..., :1])
    np.testing.assert_allclose(y, x * mask / (1 - p), rtol=1e-12)
    np.testing.assert_allclose(grads[0], ws[0] * mask / (1 - p), rtol=1e-12)
    if p:
        assert 0 < mask.sum() < mask.size, "a 40% dropout of 24 values kept all or none of them"
    check_fd(op, fn, [x], grads, ws)
    # not training: identity
    leaf = ember.tensor(x, requires_grad=True)
    out = getattr(EF, op)(leaf, p, training=False)
    ember.autograd.backward([out], [ember.tensor(ws[0])])
    np.testing.assert_array_equal(leaf.grad.numpy(), ws[0])


def test_dropout_sdpa_is_seeded(f64: Any) -> None:
    """Attention dropout draws from the device stream too: same seed, same gradient."""
    q, k, v = N(1, 3, 4), N(1, 5, 4), N(1, 5, 2)

    def fn(e: Any, F: Any, *t: Any) -> Any:  # noqa: N803
        f64.seed(3)
        return F.scaled_dot_product_attention(*t, dropout_p=0.3)

    first, ws = ember_grads(fn, [q, k, v], seed=1)
    again, _ = ember_grads(fn, [q, k, v], seed=1)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    check_fd("sdpa-dropout", fn, [q, k, v], first, ws)


# ------------------------------------------------------------------------------------------------------------
# balanced checkpointing: identical gradients
# ------------------------------------------------------------------------------------------------------------
def _cnn(e: Any, F: Any, x: Any, w1: Any, b1: Any, gamma: Any, beta: Any, w2: Any, b2: Any) -> Any:  # noqa: N803
    h = F.conv2d(x, w1, b1, padding=1)
    h = F.batch_norm(h, None, None, gamma, beta, training=True)
    h = F.max_pool2d(F.relu(h), 2)
    logits = F.linear(h.flatten(1), w2, b2)
    return F.cross_entropy(logits, e.tensor(I(0, 2, 1)), label_smoothing=0.1)


_CNN_INPUTS = (N(3, 2, 6, 6), N(4, 2, 3, 3, scale=0.3), N(4), 1 + N(4, scale=0.1), N(4, scale=0.1),
               N(3, 36, scale=0.2), N(3))


def _balanced_equal(ad: Any, balanced: Any, fn: Fn, arrays: Sequence[np.ndarray], name: str) -> None:
    plain_grads, _ = ember_grads(fn, arrays, seed=5, device=ad)
    prev = ember.default_device()
    ember.set_default_device(balanced)  # constants made inside fn follow the leaves
    try:
        bal_grads, _ = ember_grads(fn, arrays, seed=5, device=balanced)
    finally:
        ember.set_default_device(prev)
    for i, (a, b) in enumerate(zip(plain_grads, bal_grads)):
        # an input read only for its shape (view_as's other) has no gradient either way, as in PyTorch
        assert (a is None) == (b is None), f"{name}: input {i} has a gradient with one recipe only"
        if a is not None:
            np.testing.assert_array_equal(b, a, err_msg=f"{name}: input {i}, balanced checkpointing vs none")
    assert any(a is not None for a in plain_grads), f"{name}: no input has a gradient"


def test_checkpointing_cnn_identical(f64: Any, balanced: Any) -> None:
    require_dtype(balanced, ember.float64)
    _balanced_equal(f64, balanced, _cnn, _CNN_INPUTS, "cnn")
    # and the CNN's gradient itself is right
    run_case(Case("cnn", _cnn, _CNN_INPUTS))


@pytest.mark.parametrize("c", CASES[::7], ids=_case_id)
def test_checkpointing_sample_identical(f64: Any, balanced: Any, c: Case) -> None:
    _balanced_equal(f64, balanced, c.fn, c.inputs, c.id)


# ------------------------------------------------------------------------------------------------------------
# the gradient API and its error paths
# ------------------------------------------------------------------------------------------------------------
def _leaf(*shape: int, ad: Any, seed: int = 0) -> Any:
    return ember.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=ad,
                        requires_grad=True)


def test_backward_without_autodiff_says_how_to_fix(device: Any) -> None:
    plain = _undecorated(device)
    if plain is None or getattr(plain.stack, "differentiable", False):
        pytest.skip(f"device {device} has no plain (non-differentiable) variant")
    x = ember.ones(3, device=plain)
    x.requires_grad_()  # allowed: the error comes with backward, naming the fix
    y = (x * 2).sum()
    fix = f".{registry.differentiable_decorator().name}()" if _autodiff_installed() else "records gradients"
    with raises(AutodiffError, fix, "backward"):
        y.backward()
    with raises(AutodiffError, fix):
        ember.autograd.grad(y, x)
    assert x.grad is None


def test_tensors_of_different_autodiff_devices_do_not_mix(device: Any) -> None:
    base = _undecorated(device)
    if base is None or getattr(base.stack, "differentiable", False) or not _autodiff_installed():
        pytest.skip(f"device {device}: no plain backend to decorate twice")
    a = ember.ones(3, device=base.autodiff(), requires_grad=True)
    b = ember.ones(3, device=base.autodiff(checkpointing="balanced"), requires_grad=True)
    assert a.device is not b.device
    with raises(DeviceError, "add"):
        a + b
    with pytest.raises(DeviceError):
        ember.matmul(a, b)
    with pytest.raises(DeviceError):
        ember.autograd.backward([a.sum(), b.sum()])


def test_backward_non_scalar_needs_gradient(on_ad: Any) -> None:
    x = _leaf(2, 3, ad=on_ad)
    y = x * 3
    with raises(AutodiffError, "scalar", "(2, 3)"):
        y.backward()
    with raises(AutodiffError, "shape"):
        y.backward(ember.ones(3, device=on_ad))
    y.backward(ember.ones(2, 3, device=on_ad))
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 3.0, np.float32))


def test_second_backward_through_freed_graph(on_ad: Any) -> None:
    x = _leaf(4, ad=on_ad)
    y = (x * x).sum()
    y.backward()
    with raises(AutodiffError, "second time", "retain_graph=True"):
        y.backward()
    x2 = _leaf(4, ad=on_ad, seed=1)
    y2 = (x2 * x2).sum()
    y2.backward(retain_graph=True)
    once = x2.grad.numpy().copy()
    y2.backward()
    np.testing.assert_allclose(x2.grad.numpy(), 2 * once, rtol=1e-6)
    np.testing.assert_allclose(once, 2 * x2.detach().numpy(), rtol=1e-6)


def test_inplace_modification_of_saved_tensor(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    y = x * 2
    z = y * y  # saves y
    y.add_(1)
    with raises(AutodiffError, "in-place"):
        z.sum().backward()
    # the same in-place change before the use is fine
    x2 = _leaf(3, ad=on_ad)
    y2 = x2 * 2
    y2.add_(1)
    (y2 * y2).sum().backward()
    np.testing.assert_allclose(x2.grad.numpy(), 4 * (2 * x2.detach().numpy() + 1), rtol=1e-6)


def test_inplace_on_leaf_requiring_grad(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    with raises(AutodiffError, "leaf", "no_grad"):
        x.add_(1)
    with pytest.raises(AutodiffError):
        x[0] = 2.0
    with ember.no_grad():  # the parameter-update pattern
        x.sub_(0.5)
    assert x.requires_grad and x.is_leaf


def test_grad_accumulates(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 5.0), rtol=1e-6)
    x.grad = None
    (x * 4).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 4.0), rtol=1e-6)


def test_no_grad_context_and_decorator(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    with ember.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    assert ember.is_grad_enabled()

    @ember.no_grad()
    def double(t: Any) -> Any:
        assert not ember.is_grad_enabled()
        return t * 2

    z = double(x)
    assert not z.requires_grad and z.grad_fn is None
    assert ember.is_grad_enabled()
    w = x * 2
    assert w.requires_grad and w.grad_fn is not None and not w.is_leaf
    with ember.no_grad(), ember.enable_grad():
        assert (x * 2).requires_grad


def test_detach_shares_data_but_is_untracked(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None and d.is_leaf
    np.testing.assert_array_equal(d.numpy(), y.numpy())
    d.mul_(0.0)  # PyTorch: in-place on a detached tensor writes the original's memory
    np.testing.assert_array_equal(y.numpy(), np.zeros(3, np.float32))
    dx = x.detach()
    with ember.no_grad():
        dx.fill_(1.0)
    np.testing.assert_array_equal(x.numpy(), np.ones(3, np.float32))
    assert x.requires_grad and x.grad is None


def test_detach_shares_the_version_counter(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    y = x * 1.0
    z = y * y  # saves y
    y.detach().add_(1.0)
    with raises(AutodiffError, "in-place"):
        z.sum().backward()


def test_autograd_grad(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    w = _leaf(3, ad=on_ad, seed=1)
    unused = _leaf(2, ad=on_ad, seed=2)
    y = (x * w).sum()
    gx, gw = ember.autograd.grad(y, [x, w], retain_graph=True)
    np.testing.assert_allclose(gx.numpy(), w.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(gw.numpy(), x.detach().numpy(), rtol=1e-6)
    assert x.grad is None and w.grad is None  # functional: .grad untouched
    assert not gx.requires_grad and gx.device is on_ad
    with raises(AutodiffError, "allow_unused=True"):
        ember.autograd.grad(y, [x, unused], retain_graph=True)
    gx2, gu = ember.autograd.grad(y, [x, unused], allow_unused=True, retain_graph=True)
    assert gu is None
    np.testing.assert_array_equal(gx2.numpy(), gx.numpy())
    v = x * w  # non-scalar with grad_outputs
    (g,) = ember.autograd.grad([v], [x], grad_outputs=[ember.full((3,), 2.0, device=on_ad)])
    np.testing.assert_allclose(g.numpy(), 2 * w.detach().numpy(), rtol=1e-6)
    with raises(AutodiffError, "scalar"):
        ember.autograd.grad(v, x)
    ember.autograd.grad(y, x)  # retain_graph defaults to False: the graph is freed
    with raises(AutodiffError, "second time"):
        ember.autograd.grad(y, x)
    with raises(AutodiffError, "does not require grad"):
        ember.autograd.grad(y, ember.ones(3, device=on_ad))


def test_requires_grad_rules(on_ad: Any) -> None:
    i = ember.ones(3, dtype=ember.int64, device=on_ad)
    with raises(DTypeError, "floating"):
        i.requires_grad_()
    with pytest.raises(DTypeError):
        ember.ones(3, dtype=ember.int32, device=on_ad, requires_grad=True)
    x = ember.randn(2, 3, requires_grad=True, device=on_ad)
    assert x.requires_grad and x.is_leaf and x.grad_fn is None and x.device is on_ad
    y = x.sum(1) * 2
    assert y.requires_grad and y.device is on_ad and not y.is_leaf
    with pytest.raises(AutodiffError):
        y.requires_grad_(False)  # only leaves change their flag
    k = x.argmax(1)  # integer results are never tracked
    assert not k.requires_grad and k.dtype is ember.int64
    c = x > 0
    assert not c.requires_grad
    x.requires_grad_(False)
    assert not (x * 2).requires_grad


def test_retain_grad_on_non_leaf(on_ad: Any) -> None:
    x = _leaf(3, ad=on_ad)
    h = x * 3
    h.retain_grad()
    g = x * 5
    (h * h + g).sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), 2 * h.detach().numpy(), rtol=1e-6)
    assert g.grad is None  # not retained
    np.testing.assert_allclose(x.grad.numpy(), 18 * x.detach().numpy() + 5, rtol=1e-5)


def test_tensors_created_on_or_moved_to_ad_inherit_its_context(device: Any, on_ad: Any) -> None:
    x = ember.zeros(2, 2, device=on_ad, requires_grad=True)
    assert x.device is on_ad
    assert ember.ones_like(x).device is on_ad and ember.arange(3, device=on_ad).device is on_ad
    plain = _undecorated(device)
    src = ember.ones(2, 2, device=plain if plain is not None else on_ad)
    moved = src.to(on_ad)
    assert moved.device is on_ad
    moved.requires_grad_()
    (moved * x + moved).sum().backward()
    np.testing.assert_array_equal(moved.grad.numpy(), np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((2, 2), np.float32))
    # results of ops inherit the device, also for mixed tracked/untracked operands and Python scalars
    r = (x + ember.ones(2, 2, device=on_ad)) * 2.0
    assert r.device is on_ad and r.requires_grad
