"""Conformance: ``ember.compile`` replays give the eager results, op by op, on the device under test.

For every elementwise op of the op registry (``ember.opinfo``) and the nn/tensor ops the kit covers (convolutions,
pools, norms, losses, attention, activations, reductions, indexing, shape ops), a compiled function calling the op
is called three times with fresh inputs of the same shapes -- the first call records, the other two replay -- and
each result is compared with the eager call on a copy of the same inputs: bit for bit on host backends (flex:
the replay runs the very kernels eager runs), within the kit's tolerances (:data:`ember.testing.TOLERANCES`)
elsewhere. The differentiable cases also run a compiled forward+backward on the device's gradient decorator
(the device itself when it records gradients, else the installed differentiable decorator on it), comparing the
gradients; whole training steps (SGD with momentum, Adam, AdamW under a scheduler, BatchNorm, Dropout drawing from
the seeded device stream) compare the parameters after a few steps eager and compiled.

A device whose steps cannot be recorded (its stack has a decorator ember.compile cannot trace: a router, a remote
device) runs compiled functions eagerly with a reason: its results are still checked, and
``test_device_replays_or_says_why`` skips naming the reason. Where the device replays, every case here must
replay, except the ops whose result shape depends on the data (a documented graph break).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

import ember
from ember import opinfo
from ember.nn import functional as F
from ember.testing import TOLERANCES, assert_close
from ember.testing._helpers import default_device, grad_device, need

CALLS = 3  # one recording, two replays


# ------------------------------------------------------------------------------------------------------------
# cases
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One op under replay: ``fn(*tensors)`` on inputs made by ``make(rng)`` (numpy arrays, fresh per call).

    ``grad``: differentiable in its first input (a float tensor), so the gradient check runs it too.
    ``breaks``: the op reads a value it computed (its result's shape depends on the data): a graph break, the
    reason holding this fragment. ``grad_breaks``: the same for its gradient only (a rule that branches on the
    data). ``special``: the forward check also feeds NaN, +-inf and -0.0 in the first input (an elementwise op
    on all reals).
    """

    name: str
    fn: Callable[..., Any]
    make: Callable[[np.random.Generator], tuple[np.ndarray, ...]]
    grad: bool = False
    breaks: str | None = None
    grad_breaks: str | None = None
    special: bool = False


def _f(*shape: int, lo: float | None = None, hi: float | None = None) -> Callable[[np.random.Generator], np.ndarray]:
    """float32 normal samples of ``shape`` (uniform in [lo, hi] when given)."""
    def make(rng: np.random.Generator) -> np.ndarray:
        if lo is not None and hi is not None:
            return rng.uniform(lo, hi, shape).astype(np.float32)
        return (rng.standard_normal(shape) * 2).astype(np.float32)
    return make


def _i(*shape: int, lo: int = -20, hi: int = 20, dtype: Any = np.int32) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.integers(lo, hi, shape).astype(dtype)


def _b(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.random(shape) < 0.5


def _inputs(*makers: Callable[[np.random.Generator], np.ndarray]) -> Callable[[np.random.Generator],
                                                                                    tuple[np.ndarray, ...]]:
    return lambda rng: tuple(m(rng) for m in makers)


#: float samples inside each registry domain (a replay of NaNs would compare equal whatever it computed)
_DOMAIN: dict[str, tuple[float, float] | None] = {
    "real": None, "nonzero": (0.2, 3.0), "off_integers": None, "positive": (0.3, 3.0),
    "above_minus_one": (-0.6, 2.0), "above_one": (1.2, 3.0), "open_unit": (-0.9, 0.9), "half_period": (-1.2, 1.2),
}
_COMPOSITION_ARGS: dict[str, tuple[float, ...]] = {"clamp": (-1.0, 1.0), "clamp_min": (0.5,), "clamp_max": (0.5,)}


def _float_maker(op: opinfo.OpInfo, *shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    dom = _DOMAIN.get(op.domain)
    if op.samples == "unit":
        dom = (-0.9, 0.9)
    if dom is None:
        return _f(*shape)
    lo, hi = dom
    if op.domain == "nonzero":  # both signs, away from zero
        return lambda rng: (rng.uniform(lo, hi, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
    return _f(*shape, lo=lo, hi=hi)


def _call(name: str, *extra: Any, **kw: Any) -> Callable[..., Any]:
    """``ember.<name>(*tensors, *extra, **kw)``."""
    fn = getattr(ember, name)
    return lambda *t: fn(*t, *extra, **kw)


#: ops whose gradient rule reads values to branch: a graph break of the gradient step, eager results. None today:
#: prod's and cumprod's zero handling selects on device while recording, and maximum/minimum's tie check (and what
#: is built on them) records its tie pass under ember.compile
_GRAD_READS: frozenset[str] = frozenset()
_AD_READS = "ember.autograd.backward reads"


def _elementwise_cases() -> list[Case]:
    cases = []
    for op in opinfo.OPS:
        if op.arity == 1:
            if op.domain == "integers":
                make = _inputs(_i(3, 5))
            elif op.domain == "bools":
                make = _inputs(_b(3, 5))
            else:
                make = _inputs(_float_maker(op, 3, 5))
            cases.append(Case(op.name, _call(op.name, *_COMPOSITION_ARGS.get(op.name, ())), make,
                              grad=op.differentiable and op.domain not in ("integers", "bools"),
                              special=op.samples == "special" and op.domain not in ("integers", "bools")))
        elif op.arity == 2:
            if op.dtypes == "integral":
                rhs = _i(5, lo=0, hi=6) if op.int_rhs == "shift" else _i(5)
                make = _inputs(_i(3, 5), rhs)
            else:
                lhs = _f(3, 5, lo=0.3, hi=3.0) if op.name in ("pow", "xlogy") else _float_maker(op, 3, 5)
                rhs = _f(5, lo=0.3, hi=3.0) if op.name in ("div", "floor_divide", "remainder", "fmod", "xlogy") \
                    else _f(3, 5) if op.name == "equal" else _f(5)  # equal of two shapes is False unread
                make = _inputs(lhs, rhs)
            breaks = "reads the value" if op.name in ("allclose", "equal") else None
            cases.append(Case(op.name, _call(op.name), make, grad=op.differentiable and op.dtypes != "integral"
                              and breaks is None, breaks=breaks, special=op.dtypes != "integral"))
        else:
            if op.name == "where":
                cases.append(Case(op.name, lambda x, c, y: ember.where(c, x, y), _inputs(_f(3, 5), _b(3, 5), _f(5)),
                                  grad=True))
            elif op.name == "lerp":
                cases.append(Case(op.name, _call("lerp"), _inputs(_f(3, 5), _f(3, 5), _f(5, lo=0, hi=1)), grad=True))
            else:  # addcmul, addcdiv
                cases.append(Case(op.name, _call(op.name, value=0.5),
                                  _inputs(_f(3, 5), _f(3, 5), _f(5, lo=0.5, hi=2.0)), grad=True))
    return cases


def _nn_cases() -> list[Case]:
    f, i = _f, _i
    C = Case
    return [
        # convolutions and pools
        C("conv1d", lambda x, w, b: F.conv1d(x, w, b, padding=1), _inputs(f(2, 3, 9), f(4, 3, 3), f(4)), grad=True),
        C("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
          _inputs(f(2, 3, 7, 7), f(4, 3, 3, 3), f(4)), grad=True),
        C("conv2d_groups", lambda x, w: F.conv2d(x, w, groups=2, dilation=2), _inputs(f(1, 4, 8, 8), f(4, 2, 3, 3)),
          grad=True),
        C("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2),
          _inputs(f(2, 3, 4, 4), f(3, 2, 3, 3), f(2)), grad=True),
        C("max_pool2d", lambda x: F.max_pool2d(x, 2), _inputs(f(2, 3, 6, 6)), grad=True),
        C("max_pool2d_stride", lambda x: F.max_pool2d(x, 3, stride=2, padding=1), _inputs(f(1, 2, 7, 7)), grad=True),
        C("avg_pool2d", lambda x: F.avg_pool2d(x, 2), _inputs(f(2, 3, 6, 6)), grad=True),
        C("avg_pool1d", lambda x: F.avg_pool1d(x, 3, stride=2), _inputs(f(2, 3, 9)), grad=True),
        C("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (2, 3)), _inputs(f(2, 3, 7, 8)), grad=True),
        C("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x, 3), _inputs(f(2, 3, 8)), grad=True),
        C("interpolate_nearest", lambda x: F.interpolate(x, scale_factor=2), _inputs(f(1, 2, 3, 4)), grad=True),
        C("interpolate_bilinear", lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False),
          _inputs(f(1, 2, 3, 4)), grad=True),
        C("unfold", lambda x: F.unfold(x, 2, stride=2), _inputs(f(1, 2, 4, 6)), grad=True),
        C("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), _inputs(f(1, 8, 3, 3)), grad=True),
        C("pad_reflect", lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"), _inputs(f(1, 2, 4, 5)), grad=True),
        # norms
        C("batch_norm_train", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
          _inputs(f(4, 3, 5), f(3), f(3)), grad=True),
        C("batch_norm_eval", lambda x, m, v: F.batch_norm(x, m, v, training=False),
          _inputs(f(4, 3, 5), f(3), f(3, lo=0.5, hi=2.0)), grad=True),
        C("layer_norm", lambda x, w, b: F.layer_norm(x, (6,), w, b), _inputs(f(3, 4, 6), f(6), f(6)), grad=True),
        C("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), _inputs(f(2, 4, 5), f(4), f(4)), grad=True),
        C("instance_norm", lambda x: F.instance_norm(x), _inputs(f(2, 3, 6)), grad=True),
        C("rms_norm", lambda x, w: F.rms_norm(x, (6,), w), _inputs(f(3, 6), f(6)), grad=True),
        C("normalize", lambda x: F.normalize(x, dim=1), _inputs(f(4, 5)), grad=True),
        # losses
        C("cross_entropy", lambda x, y: F.cross_entropy(x, y), _inputs(f(6, 4), i(6, lo=0, hi=4, dtype=np.int64)),
          grad=True),
        C("cross_entropy_smoothing", lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1, reduction="sum"),
          _inputs(f(6, 4), i(6, lo=0, hi=4, dtype=np.int64)), grad=True),
        C("nll_loss", lambda x, y: F.nll_loss(F.log_softmax(x, 1), y),
          _inputs(f(5, 3), i(5, lo=0, hi=3, dtype=np.int64)), grad=True),
        C("mse_loss", lambda x, y: F.mse_loss(x, y), _inputs(f(4, 5), f(4, 5)), grad=True),
        C("l1_loss", lambda x, y: F.l1_loss(x, y, reduction="none"), _inputs(f(4, 5), f(4, 5)), grad=True),
        C("smooth_l1_loss", lambda x, y: F.smooth_l1_loss(x, y), _inputs(f(4, 5), f(4, 5)), grad=True),
        C("huber_loss", lambda x, y: F.huber_loss(x, y, delta=0.5), _inputs(f(4, 5), f(4, 5)), grad=True),
        C("binary_cross_entropy", lambda x, y: F.binary_cross_entropy(x, y),
          _inputs(f(4, 5, lo=0.05, hi=0.95), f(4, 5, lo=0, hi=1)), grad=True),
        C("binary_cross_entropy_with_logits", lambda x, y: F.binary_cross_entropy_with_logits(x, y),
          _inputs(f(4, 5), f(4, 5, lo=0, hi=1)), grad=True),
        C("kl_div", lambda x, y: F.kl_div(F.log_softmax(x, 1), y, reduction="batchmean"),
          _inputs(f(4, 5), f(4, 5, lo=0.1, hi=1)), grad=True),
        # attention, linear layers, embeddings
        C("scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
          _inputs(f(2, 3, 5, 4), f(2, 3, 6, 4), f(2, 3, 6, 4)), grad=True),
        C("scaled_dot_product_attention_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                                                is_causal=True),
          _inputs(f(2, 5, 4), f(2, 5, 4), f(2, 5, 4)), grad=True),
        C("linear", lambda x, w, b: F.linear(x, w, b), _inputs(f(3, 5), f(4, 5), f(4)), grad=True),
        C("matmul", lambda a, b: ember.matmul(a, b), _inputs(f(2, 3, 4), f(4, 5)), grad=True),
        C("embedding", lambda w, idx: F.embedding(idx, w), _inputs(f(7, 3), i(2, 4, lo=0, hi=7, dtype=np.int64)),
          grad=True),
        C("one_hot", lambda y: F.one_hot(y, 5), _inputs(i(6, lo=0, hi=5, dtype=np.int64))),
        C("cosine_similarity", lambda a, b: F.cosine_similarity(a, b), _inputs(f(4, 5), f(4, 5)), grad=True),
        # activations
        C("softmax", lambda x: F.softmax(x, dim=-1), _inputs(f(3, 5)), grad=True),
        C("log_softmax", lambda x: F.log_softmax(x, dim=0), _inputs(f(3, 5)), grad=True),
        C("gelu", lambda x: F.gelu(x), _inputs(f(3, 5)), grad=True),
        C("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), _inputs(f(3, 5)), grad=True),
        C("silu", lambda x: F.silu(x), _inputs(f(3, 5)), grad=True),
        C("elu", lambda x: F.elu(x), _inputs(f(3, 5)), grad=True),
        C("celu", lambda x: F.celu(x, 0.5), _inputs(f(3, 5)), grad=True),
        C("leaky_relu", lambda x: F.leaky_relu(x, 0.1), _inputs(f(3, 5)), grad=True),
        C("softplus", lambda x: F.softplus(x), _inputs(f(3, 5)), grad=True),
        C("hardtanh", lambda x: F.hardtanh(x), _inputs(f(3, 5)), grad=True),
        C("softshrink", lambda x: F.softshrink(x), _inputs(f(3, 5)), grad=True),
        C("threshold", lambda x: F.threshold(x, 0.1, 20.0), _inputs(f(3, 5)), grad=True),
        C("prelu", lambda x, w: F.prelu(x, w), _inputs(f(2, 3, 4), f(3)), grad=True),
        C("glu", lambda x: F.glu(x, dim=-1), _inputs(f(3, 6)), grad=True),
        # reductions
        C("sum", lambda x: x.sum(), _inputs(f(4, 5)), grad=True),
        C("sum_dim", lambda x: ember.sum(x, dim=(0, 2), keepdim=True), _inputs(f(3, 4, 5)), grad=True),
        C("mean", lambda x: x.mean(dim=1), _inputs(f(4, 5)), grad=True),
        C("prod", lambda x: x.prod(dim=0), _inputs(f(4, 5)), grad=True),
        C("prod_all", lambda x: x.prod(), _inputs(f(2, 3, lo=0.5, hi=1.5)), grad=True),
        C("cumprod", lambda x: ember.cumprod(x, dim=1), _inputs(f(4, 5)), grad=True),
        C("var", lambda x: ember.var(x, dim=1, correction=0), _inputs(f(4, 5)), grad=True),
        C("std", lambda x: x.std(), _inputs(f(4, 5)), grad=True),
        C("max_dim", lambda x: ember.max(x, dim=1), _inputs(f(4, 5)), grad=True),
        C("amin", lambda x: x.amin(dim=0), _inputs(f(4, 5)), grad=True),
        C("argmax", lambda x: x.argmax(dim=1), _inputs(f(4, 5))),
        C("logsumexp", lambda x: ember.logsumexp(x, dim=1), _inputs(f(4, 5)), grad=True),
        C("norm", lambda x: ember.norm(x), _inputs(f(4, 5)), grad=True),
        C("cumsum", lambda x: ember.cumsum(x, dim=1), _inputs(f(4, 5)), grad=True),
        C("sort", lambda x: ember.sort(x, dim=1), _inputs(f(4, 5)), grad=True),
        C("topk", lambda x: ember.topk(x, 2), _inputs(f(4, 5)), grad=True),
        C("sum_int", lambda x: x.sum(dim=0), _inputs(i(4, 5))),
        C("any", lambda x: ember.any(x > 0, dim=1), _inputs(f(4, 5))),
        # indexing
        C("getitem", lambda x: x[1:, ::2], _inputs(f(4, 5)), grad=True),
        # integer-tensor indexing wraps negative indices only when the recorded ones hold one: a break
        C("getitem_tensor", lambda x, idx: x[idx], _inputs(f(5, 3), i(4, lo=0, hi=5, dtype=np.int64)), grad=True),
        # negative indices, and a replay whose indices are negative where the recording's were not
        C("getitem_negative", lambda x, idx: x[idx], _inputs(f(5, 3), i(4, lo=-5, hi=5, dtype=np.int64)),
          grad=True),
        C("index_select", lambda x, idx: ember.index_select(x, 1, idx), _inputs(f(3, 5), i(4, lo=0, hi=5,
                                                                                       dtype=np.int64)), grad=True),
        C("gather", lambda x, idx: ember.gather(x, 1, idx), _inputs(f(3, 5), i(3, 2, lo=0, hi=5, dtype=np.int64)),
          grad=True),
        C("scatter_add", lambda x, idx, s: ember.scatter_add(x, 1, idx, s),
          _inputs(f(3, 5), i(3, 2, lo=0, hi=5, dtype=np.int64), f(3, 2)), grad=True),
        C("masked_fill", lambda x, m: x.masked_fill(m, -1.5), _inputs(f(3, 5), _b(3, 5)), grad=True),
        C("take_along_dim", lambda x, idx: ember.take_along_dim(x, idx, 1),
          _inputs(f(3, 5), i(3, 2, lo=0, hi=5, dtype=np.int64)), grad=True),
        C("tril", lambda x: ember.tril(x, -1), _inputs(f(4, 4)), grad=True),
        C("setitem", lambda x, v: _setitem(x, v), _inputs(f(4, 5), f(5)), grad=True),
        C("nonzero", lambda x: ember.nonzero(x > 0), _inputs(f(4, 5)), breaks="boolean-mask"),
        C("masked_select", lambda x, m: ember.masked_select(x, m), _inputs(f(3, 5), _b(3, 5)),
          breaks="boolean-mask"),
        # shape ops
        C("reshape", lambda x: x.reshape(5, 4), _inputs(f(4, 5)), grad=True),
        C("permute", lambda x: x.permute(2, 0, 1) * 1.5, _inputs(f(2, 3, 4)), grad=True),
        C("transpose_contiguous", lambda x: x.transpose(0, 1).contiguous(), _inputs(f(3, 4)), grad=True),
        C("cat", lambda a, b: ember.cat([a, b], dim=1), _inputs(f(3, 2), f(3, 4)), grad=True),
        C("stack", lambda a, b: ember.stack([a, b]), _inputs(f(3, 4), f(3, 4)), grad=True),
        C("split", lambda x: ember.split(x, [1, 3], dim=1), _inputs(f(2, 4)), grad=True),
        C("chunk", lambda x: x.chunk(2, dim=0), _inputs(f(4, 3)), grad=True),
        C("flatten", lambda x: x.flatten(1), _inputs(f(2, 3, 4)), grad=True),
        C("squeeze_unsqueeze", lambda x: x.squeeze(1).unsqueeze(0), _inputs(f(3, 1, 4)), grad=True),
        C("expand", lambda x: x.expand(3, 4, 5) + 0.5, _inputs(f(4, 1)), grad=True),
        C("flip", lambda x: ember.flip(x, (0, 1)), _inputs(f(3, 4)), grad=True),
        C("roll", lambda x: ember.roll(x, 2, 1), _inputs(f(3, 4)), grad=True),
        C("repeat", lambda x: x.repeat(2, 3), _inputs(f(2, 3)), grad=True),
        C("tile", lambda x: ember.tile(x, (2,)), _inputs(f(2, 3)), grad=True),
        C("cast", lambda x: x.to(ember.float64) if default_device().supports_dtype(ember.float64)
          else x.to(ember.int32), _inputs(f(3, 4)), grad=False),
        C("arange_in_step", lambda x: x * ember.arange(4, device=x.device), _inputs(f(3, 4)), grad=True),
        C("tensor_in_step", lambda x: x + ember.tensor([1.0, 2.0, 3.0, 4.0], device=x.device), _inputs(f(3, 4)),
          grad=True),
        C("inplace_on_input", lambda x, y: x.mul_(2).add_(y), _inputs(f(3, 4), f(4))),
        C("returns_input_and_constant", lambda x, y: (x, x + y, {"k": 3, "t": y.sum()}), _inputs(f(3, 4), f(4))),
    ]


def _setitem(x: Any, v: Any) -> Any:
    y = x * 1.0
    y[1] = v
    y[2:, 1] = 0.25
    return y


CASES: dict[str, Case] = {c.name: c for c in (*_elementwise_cases(), *_nn_cases())}
CASES.update({n: replace(CASES[n], grad_breaks=_AD_READS) for n in _GRAD_READS})
GRAD_CASES = sorted(n for n, c in CASES.items() if c.grad)


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------
def _exact(device: Any) -> bool:
    """Bit-identical comparison on host backends (flex): the replay runs the kernels eager runs, and their fused
    kernels compute what their unfused ones do; device backends' fused kernels may round differently (FMA
    contraction), so they compare within the kit's tolerances."""
    from ember.plugins.manager import registry

    spec = registry.backend(device.kind)
    return bool(spec is not None and spec.host)


def _seed(name: str, k: int) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{name}:{k}".encode()))


def _tensors(arrays: tuple[np.ndarray, ...], device: Any) -> list[Any]:
    for a in arrays:
        need(a.dtype)
    return [ember.tensor(a.copy(), device=device) for a in arrays]


def _flat(out: Any, into: list[Any], path: str = "out") -> list[Any]:
    if isinstance(out, ember.Tensor):
        into.append((path, out))
    elif isinstance(out, (tuple, list)):
        for k, o in enumerate(out):
            _flat(o, into, f"{path}[{k}]")
    elif isinstance(out, dict):
        for k, o in out.items():
            _flat(o, into, f"{path}[{k!r}]")
    else:
        into.append((path, out))
    return into


def _same(got: Any, want: Any, exact: bool, what: str) -> None:
    """``got`` (replayed/compiled) equals ``want`` (eager): structure, shapes, dtypes, values."""
    g, w = _flat(got, []), _flat(want, [])
    assert [p for p, _ in g] == [p for p, _ in w], f"{what}: structure {[p for p, _ in g]} != {[p for p, _ in w]}"
    assert type(got) is type(want), f"{what}: {type(got).__name__} != {type(want).__name__}"
    for (path, a), (_, b) in zip(g, w):
        if not isinstance(b, ember.Tensor):
            assert a == b, f"{what} {path}: {a!r} != {b!r}"
            continue
        assert isinstance(a, ember.Tensor), f"{what} {path}: {type(a).__name__} is not a Tensor"
        assert tuple(a.shape) == tuple(b.shape) and a.dtype is b.dtype, \
            f"{what} {path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        if exact:
            x, y = a.numpy(), b.numpy()
            np.testing.assert_array_equal(x, y, err_msg=f"{what} {path}: replay differs from eager on flex")
            assert x.tobytes() == y.tobytes(), f"{what} {path}: not bit-identical (signed zeros or NaN payloads)"
        else:
            assert_close(a, b, msg=f"{what} {path}")


@contextmanager
def _default(device: Any) -> Iterator[None]:
    previous = ember.default_device()
    ember.set_default_device(device)
    try:
        yield
    finally:
        ember.set_default_device(previous)


_REPLAYS: dict[Any, str | None] = {}


def _cannot_replay(device: Any) -> str | None:
    """Why ``device`` runs compiled functions eagerly (its stack cannot be recorded), or None when it replays."""
    if device not in _REPLAYS:
        f = ember.compile(lambda x: x * 2.0 + 1.0)
        for _ in range(2):
            f(ember.ones(3, device=device))
        s = f.stats()
        _REPLAYS[device] = None if s["replays"] else str(s["reason"])
    return _REPLAYS[device]


def _check_replayed(stats: dict[str, Any], device: Any, case: Case, calls: int = CALLS,
                    breaks: str | None = None) -> None:
    """Where the device replays: a data-dependent op breaks with its reason (``breaks``), every other case
    replays."""
    if _cannot_replay(device) is not None:
        assert stats["replays"] == 0 and stats["reason"], stats
        return
    if breaks is not None:
        assert stats["replays"] == 0 and stats["graph_breaks"] == 1, stats
        assert breaks in str(stats["reason"]), stats
        return
    assert stats["graph_breaks"] == 0 and stats["replays"] == calls - stats["recordings"] >= 1, \
        f"{case.name} did not replay on {device}: {stats}"


# ------------------------------------------------------------------------------------------------------------
# forward: every op, recorded then replayed twice
# ------------------------------------------------------------------------------------------------------------
def test_device_replays_or_says_why(device: Any) -> None:
    """A device either replays a compiled function or gives the reason it runs it eagerly."""
    reason = _cannot_replay(device)
    if reason is not None:
        pytest.skip(f"ember.compile runs eagerly on {device}: {reason}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_replay_matches_eager(device: Any, name: str) -> None:
    case = CASES[name]
    compiled = ember.compile(case.fn)
    exact = _exact(device)
    for k in range(CALLS):
        arrays = case.make(_seed(name, k))
        if case.special:  # the special values, at other places on every call
            first = arrays[0].copy()
            first.flat[[k, k + 4, k + 8, k + 12]] = (np.nan, np.inf, -np.inf, -0.0)
            arrays = (first, *arrays[1:])
        got = compiled(*_tensors(arrays, device))
        want = case.fn(*_tensors(arrays, device))
        _same(got, want, exact, f"{name}, call {k} ({'record' if k == 0 else 'replay'})")
    _check_replayed(compiled.stats(), device, case, breaks=case.breaks)


# ------------------------------------------------------------------------------------------------------------
# gradients: a compiled forward+backward on the device's gradient decorator
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gdev(device: Any) -> Any:
    """The device under test recording gradients (itself, or with the installed differentiable decorator)."""
    g = grad_device(device)
    if g is None:
        pytest.skip(f"device {device} records no gradients and no differentiable decorator is installed")
    return g


def _grad_step(case: Case, leaf: Any, cot: list[Any]) -> Callable[..., Any]:
    """A training-like step: the op on ``leaf`` (state the step reaches, as a parameter) and the other inputs,
    a weighted sum of its float outputs, backward. Returns the loss; ``leaf.grad`` holds the gradient."""
    def step(*rest: Any) -> Any:
        outs = [t for _, t in _flat(case.fn(leaf, *rest), []) if isinstance(t, ember.Tensor)
                and t.dtype.is_floating_point]
        loss = sum((o * c).sum() for o, c in zip(outs, cot))
        loss.backward()
        return loss
    return step


@pytest.mark.parametrize("name", GRAD_CASES)
def test_op_gradient_replay_matches_eager(gdev: Any, name: str) -> None:
    case = CASES[name]
    exact = _exact(gdev)
    with _default(gdev):
        leaves, cots, steps = [], [], []
        for _ in range(2):  # [0]: compiled, [1]: eager
            first = case.make(_seed(name, 0))
            leaf = _tensors(first[:1], gdev)[0].requires_grad_()
            outs = [t for _, t in _flat(case.fn(leaf.detach(), *_tensors(first[1:], gdev)), [])
                    if isinstance(t, ember.Tensor) and t.dtype.is_floating_point]
            rng = _seed(name + ":cotangent", 0)
            cot = [ember.tensor(rng.standard_normal(tuple(o.shape)).astype(np.float32), device=gdev) for o in outs]
            leaves.append(leaf)
            cots.append(cot)
            steps.append(_grad_step(case, leaf, cot))
        compiled = ember.compile(steps[0])
        for k in range(CALLS):
            arrays = case.make(_seed(name, k))
            for leaf in leaves:
                with ember.no_grad():
                    leaf.copy_(ember.tensor(arrays[0], device=gdev))
                leaf.grad = None
            got = compiled(*_tensors(arrays[1:], gdev))
            want = steps[1](*_tensors(arrays[1:], gdev))
            what = f"{name} gradient, call {k} ({'record' if k == 0 else 'replay'})"
            assert leaves[0].grad is not None, what
            _same(got, want.detach(), exact, what + " loss")
            _same(leaves[0].grad, leaves[1].grad, exact, what)
    _check_replayed(compiled.stats(), gdev, case, breaks=case.breaks or case.grad_breaks)


# ------------------------------------------------------------------------------------------------------------
# whole training steps: parameters after a few steps, eager vs compiled
# ------------------------------------------------------------------------------------------------------------
STEPS = 4  # a warm-up (optimizer state created), a recording, two replays


class _Net(ember.nn.Module):
    def __init__(self, norm: bool, dropout: bool) -> None:
        super().__init__()
        nn = ember.nn
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4) if norm else nn.Identity()
        self.drop = nn.Dropout(0.3) if dropout else nn.Identity()
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x: Any) -> Any:
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(h.flatten(1)))


def _sgd(params: Any) -> tuple[Any, Any]:
    return ember.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3), None


def _adam(params: Any) -> tuple[Any, Any]:
    return ember.optim.Adam(params, lr=1e-2), None


def _adamw_cosine(params: Any) -> tuple[Any, Any]:
    opt = ember.optim.AdamW(params, lr=1e-2, weight_decay=0.05)
    return opt, ember.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)


_OPTIMIZERS = {"sgd_momentum": _sgd, "adam": _adam, "adamw_scheduler": _adamw_cosine}
_MODELS = {"plain": (False, False), "batchnorm": (True, False), "dropout": (False, True)}


def _train(gdev: Any, opt_name: str, model_name: str, compiled: bool) -> tuple[list[Any], list[np.ndarray], Any]:
    ember.manual_seed(0)
    model = _Net(*_MODELS[model_name]).to(gdev)
    model.train()
    opt, sched = _OPTIMIZERS[opt_name](model.parameters())

    def step(x: Any, y: Any) -> Any:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = ember.compile(step) if compiled else step
    rng = np.random.default_rng(7)
    gdev.seed(11)  # dropout draws from the device's stream: the same draws eager and replayed
    losses = []
    for _ in range(STEPS):
        x = ember.tensor(rng.standard_normal((5, 2, 6, 6)).astype(np.float32), device=gdev)
        y = ember.tensor(rng.integers(0, 3, 5), device=gdev)
        losses.append(fn(x, y))
        if sched is not None:
            sched.step()
    state = [t.numpy().copy() for t in (*model.parameters(), *model.buffers())]
    return losses, state, fn


@pytest.mark.parametrize("model_name", sorted(_MODELS))
@pytest.mark.parametrize("opt_name", sorted(_OPTIMIZERS))
def test_training_steps_replay_as_eager(gdev: Any, opt_name: str, model_name: str) -> None:
    """Parameters, buffers (BatchNorm's running statistics) and losses after a few steps, eager vs compiled."""
    need(np.float32)
    la, sa, _ = _train(gdev, opt_name, model_name, False)
    lb, sb, fn = _train(gdev, opt_name, model_name, True)
    exact = _exact(gdev)
    for k, (a, b) in enumerate(zip(lb, la)):
        _same(a, b.detach(), exact, f"{opt_name}/{model_name} loss of step {k}")
    for k, (a, b) in enumerate(zip(sb, sa)):
        if exact:
            assert a.tobytes() == b.tobytes(), f"{opt_name}/{model_name}: state tensor {k} differs from eager"
        else:
            rtol, atol = TOLERANCES[ember.float32]  # a few steps of an optimizer: ten times one op's tolerance
            np.testing.assert_allclose(a, b, rtol=rtol * 10, atol=atol * 10,
                                       err_msg=f"{opt_name}/{model_name}: state tensor {k}")
    s = fn.stats()
    if _cannot_replay(gdev) is None:
        assert s["graph_breaks"] == 0 and s["replays"] >= 1, s


# ------------------------------------------------------------------------------------------------------------
# graph breaks, guard misses, layouts and in-place inputs
# ------------------------------------------------------------------------------------------------------------
def test_item_inside_is_a_graph_break_with_eager_results(device: Any) -> None:
    """A value read inside the step (item()) makes it run eagerly: each call's own branch, never a stale one."""
    need(np.float32)

    def branchy(x: Any) -> Any:
        return x * 2.0 if x.sum().item() > 0 else x - 3.0

    compiled = ember.compile(branchy)
    for v in (1.0, -1.0, 2.0, -2.0):
        x = np.full((2, 3), v, np.float32)
        _same(compiled(ember.tensor(x)), branchy(ember.tensor(x)), _exact(device), f"branchy({v})")
    s = compiled.stats()
    assert s["replays"] == 0 and s["calls"] == 4, s
    if _cannot_replay(device) is None:
        assert s["graph_breaks"] == 1 and "reads the value" in s["reason"], s


@pytest.mark.parametrize("name", ["allclose", "equal", "nonzero", "masked_select", "one_hot_inferred"])
def test_data_dependent_results_are_never_replayed(device: Any, name: str) -> None:
    """Ops whose result (a Python bool, or the result's shape) depends on the values: a call whose data gives
    another answer than the recording's gets its own answer (regression: these replayed the recorded one)."""
    need(np.float32)
    fns = {
        "allclose": lambda x, y: ember.allclose(x, y),
        "equal": lambda x, y: ember.equal(x, y),
        "nonzero": lambda x, y: ember.nonzero(x > y),
        "masked_select": lambda x, y: ember.masked_select(x, x > y),
        "one_hot_inferred": lambda x, y: F.one_hot((x > y).to(ember.int64) * (x > 0).to(ember.int64) * 2),
    }
    fn = fns[name]
    compiled = ember.compile(fn)
    base = np.array([1.0, 2.0, 3.0], np.float32)
    for other in (base, base, base - 5.0, base, base + 1.0):
        got = compiled(ember.tensor(base), ember.tensor(other))
        _same(got, fn(ember.tensor(base), ember.tensor(other)), _exact(device), f"{name} with {other.tolist()}")
    assert compiled.stats()["replays"] == 0, compiled.stats()


#: inputs of the prod-gradient replay, in call order: the first records, with a different zero pattern than each
#: replay (none, one zero, two in one reduction group, two in different groups, a zero beside an inf)
_ZERO_PATTERNS = (
    [[1.5, -2.0, 3.0], [0.5, 4.0, -1.0]],
    [[1.5, 0.0, 3.0], [0.5, 4.0, -1.0]],
    [[0.0, 0.0, 3.0], [0.5, 4.0, -1.0]],
    [[0.0, 2.0, 3.0], [0.5, 0.0, -1.0]],
    [[0.0, float("inf"), 3.0], [0.5, 2.0, -1.0]],
    [[1.25, -2.0, 0.5], [0.5, 4.0, -1.0]],
)


def _others_product(x: np.ndarray, dim: int | None) -> np.ndarray:
    """PyTorch's prod gradient (with respect to x) for a cotangent of ones, from its definition: for each element,
    the product of the others in its reduction group (float64); prod() of everything with two zeros or more gives
    exactly zero."""
    x64 = x.astype(np.float64)
    if dim is None:
        if np.count_nonzero(x64 == 0) > 1:
            return np.zeros_like(x64)
        flat = x64.reshape(-1)
        return np.array([np.prod(np.delete(flat, i)) for i in range(flat.size)]).reshape(x.shape)
    moved = np.moveaxis(x64, dim, -1)
    out = np.empty_like(moved)
    for idx in np.ndindex(moved.shape[:-1]):
        row = moved[idx]
        out[idx] = [np.prod(np.delete(row, i)) for i in range(row.size)]
    return np.moveaxis(out, -1, dim)


@pytest.mark.parametrize("dim", [None, 0, 1], ids=["all", "dim0", "dim1"])
def test_prod_gradient_with_zeros_replays_without_a_break(gdev: Any, dim: int | None) -> None:
    """prod's gradient handles zeros without reading a value: recorded on an input without zeros, replays of
    inputs with one zero, two zeros (in one group or apart) and a zero beside an inf give the eager gradient (bit
    for bit on host backends) and PyTorch's (the product of the others), with no graph break."""
    exact = _exact(gdev)
    with _default(gdev):
        ws = [ember.nn.Parameter(ember.ones(2, 3)) for _ in range(2)]  # [0]: compiled, [1]: eager

        def make(w: Any) -> Callable[[Any], Any]:
            def step(x: Any) -> Any:
                y = (w * x).prod() if dim is None else (w * x).prod(dim=dim)
                loss = y.sum()
                loss.backward()
                return loss
            return step

        compiled = ember.compile(make(ws[0]))
        eager = make(ws[1])
        for k, rows in enumerate(_ZERO_PATTERNS):
            x = np.array(rows, np.float32)
            for w in ws:
                w.grad = None
            what = f"prod(dim={dim}) gradient, call {k} ({x.tolist()})"
            _same(compiled(ember.tensor(x)), eager(ember.tensor(x)), exact, what + " loss")
            _same(ws[0].grad, ws[1].grad, exact, what)
            want = x.astype(np.float64) * _others_product(x, dim)  # d(w*x)/dw = x: w is ones
            finite = np.isfinite(want)
            got = ws[0].grad.numpy().astype(np.float64)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, err_msg=what)
            assert np.array_equal(np.isfinite(got), finite), what
    s = compiled.stats()
    if _cannot_replay(gdev) is None:
        assert s["graph_breaks"] == 0 and s["replays"] == len(_ZERO_PATTERNS) - 1, s


def test_guard_miss_records_again(device: Any) -> None:
    """A new input shape records a second graph; both shapes then replay, each with its own results."""
    need(np.float32)

    def fn(x: Any, w: Any) -> Any:
        return F.softmax(x @ w, dim=-1) * 2.0

    compiled = ember.compile(fn)
    rng = np.random.default_rng(3)
    shapes = [(4, 3), (4, 3), (6, 3), (6, 3), (4, 3), (6, 3)]
    for k, shape in enumerate(shapes):
        x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
        _same(compiled(ember.tensor(x), ember.tensor(w)), fn(ember.tensor(x), ember.tensor(w)), _exact(device),
              f"call {k} with x{shape}")
    s = compiled.stats()
    if _cannot_replay(device) is None:
        assert (s["recordings"], s["guard_misses"], s["replays"], s["graphs"]) == (2, 1, 4, 2), s


@pytest.mark.parametrize("name", ["elementwise_chain", "matmul", "reduction"])
def test_replay_with_inputs_of_another_layout(device: Any, name: str) -> None:
    """Recorded on contiguous inputs, replayed on transposed views (and back): guards compare shapes, not
    strides, so every kernel of the graph must take any layout."""
    need(np.float32)
    fns = {
        "elementwise_chain": lambda x, y: ember.tanh(x * 0.5 + y) * y - 1.0,
        "matmul": lambda x, y: (x @ y.transpose(0, 1)).relu(),
        "reduction": lambda x, y: (x * y).sum(dim=0) + x.amax(dim=1).sum(),
    }
    fn = fns[name]
    compiled = ember.compile(fn)
    rng = np.random.default_rng(5)
    for k, strided in enumerate((False, False, True, True, False)):
        xa, ya = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)
        mk = (lambda a: ember.tensor(np.ascontiguousarray(a.T)).transpose(0, 1)) if strided else ember.tensor
        _same(compiled(mk(xa), mk(ya)), fn(mk(xa), mk(ya)), _exact(device), f"{name} call {k} strided={strided}")
    if _cannot_replay(device) is None:
        assert compiled.stats()["replays"] == 4, compiled.stats()


def test_inplace_update_of_an_input_is_replayed(device: Any) -> None:
    """A step that updates its input in place writes each call's input, as eager does."""
    need(np.float32)

    def fn(x: Any, y: Any) -> Any:
        x.mul_(0.5).add_(y)
        return x.sum()

    compiled = ember.compile(fn)
    rng = np.random.default_rng(9)
    for k in range(CALLS + 1):
        xa, ya = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        xc, xe = ember.tensor(xa), ember.tensor(xa)
        _same(compiled(xc, ember.tensor(ya)), fn(xe, ember.tensor(ya)), _exact(device), f"call {k} result")
        _same(xc, xe, _exact(device), f"call {k}: the input updated in place")


def test_step_without_tensor_arguments_replays_on_its_state_device(device: Any) -> None:
    """A step whose data is its state (a closure) runs on the state's device: recorded, then replayed."""
    need(np.float32)
    w = ember.tensor(np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3))

    def fn() -> Any:
        w.mul_(0.5).add_(0.25)
        return w.exp().sum(dim=1)

    compiled = ember.compile(fn)
    ref = ember.tensor(w.numpy().copy())
    for k in range(CALLS):
        got = compiled()
        ref.mul_(0.5).add_(0.25)
        _same(got, ref.exp().sum(dim=1), _exact(device), f"call {k}")
        _same(w, ref, _exact(device), f"call {k}: the state updated in place")
    if _cannot_replay(device) is None:
        assert compiled.stats()["replays"] == CALLS - 1, compiled.stats()


# ------------------------------------------------------------------------------------------------------------
# the registry's other dtypes: float64 and int64 operands in one step per op
# ------------------------------------------------------------------------------------------------------------
ELEMENTWISE = sorted(op.name for op in opinfo.OPS if op.name not in ("allclose", "equal"))


def _dtype_groups(name: str, device: Any) -> list[tuple[np.ndarray, ...]]:
    """The op's float32 sample inputs as float64 and as small int64 (nonzero, non-negative where the op needs
    it), for the dtypes the device supports and the op accepts (eager raising: left out)."""
    case = CASES[name]
    base = case.make(_seed(name, 0))
    groups = []
    for d in (np.float64, np.int64):
        if not device.supports_dtype(ember.dtypes.from_numpy_dtype(np.dtype(d))):
            continue
        if d is np.int64:
            arrays = tuple(a if a.dtype == np.bool_ else
                           np.clip(np.rint(np.abs(a) * 2) + 1, 1, 5).astype(np.int64) for a in base)
        else:
            arrays = tuple(a if a.dtype == np.bool_ or a.dtype.kind in "iu" else a.astype(np.float64) for a in base)
        try:
            case.fn(*_tensors(arrays, device))
        except ember.EmberError:
            continue
        groups.append(arrays)
    return groups


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_op_replay_in_other_dtypes(device: Any, name: str) -> None:
    """Each elementwise op on float64 and int64 operands (one step for both), recorded then replayed."""
    case = CASES[name]
    groups = _dtype_groups(name, device)
    if not groups:
        pytest.skip(f"{name} takes neither float64 nor int64 operands on {device}")
    sizes = [len(g) for g in groups]

    def step(*ts: Any) -> Any:
        out, at = [], 0
        for n in sizes:
            out.append(case.fn(*ts[at:at + n]))
            at += n
        return tuple(out)

    compiled = ember.compile(step)
    for k in range(CALLS):
        rng = _seed(name + ":dtypes", k)
        arrays = [a if a.dtype == np.bool_ else (a + rng.integers(0, 2, a.shape)).astype(a.dtype) if a.dtype.kind
                  in "iu" else a * rng.uniform(0.5, 1.5, a.shape) for g in groups for a in g]
        got = compiled(*_tensors(tuple(arrays), device))
        _same(got, step(*_tensors(tuple(arrays), device)), _exact(device), f"{name} float64/int64, call {k}")
    _check_replayed(compiled.stats(), device, case, breaks=case.breaks)
