"""FusionBackend on ember.backend.Decorator: declared policies, the boundary of built-in and extension ops
(``run_extension``, which replaced ``extension_boundary``), compositions recorded on this stack, and methods of
the inner backend outside the contract."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember import dtypes as dt
from ember.backend import Backend, Decorator, Differentiable
from ember.decorator import Policy
from ember_fusion.backend import FusionBackend
from ember_fusion.graph import FArray


def test_fusion_is_a_declared_decorator(fb: FusionBackend) -> None:
    assert isinstance(fb, Decorator) and not isinstance(fb, Differentiable) and not fb.differentiable
    assert fb.records_lazily and FusionBackend.records_lazily
    assert fb.name == f"{fb.inner.name}+fusion" and fb.base_backend is fb.inner.base_backend
    assert fb.describe() == f"fusion over {fb.inner.describe()}"
    table = FusionBackend.policy
    for name in ("unary", "binary", "where", "cast", "full", "reduce", "assign", "setitem", "inplace_binary",
                 "sync", "memory_report", "dtype_of"):
        assert table[name] is Policy.HANDLE, name
    for name in ("matmul", "getitem", "reshape", "sort", "cat"):
        assert table[name] is Policy.BOUNDARY, name
    assert table["conv"] is table["softmax"] is Policy.COMPOSE
    assert not hasattr(fb, "extension_boundary")  # run_extension is the one path
    # fusion does not fuse a fused stack: a decorator never claims fusion_compile
    assert type(fb).fusion_compile is Backend.fusion_compile


def test_a_boundary_realizes_pending_inputs_as_one_plan(fb: FusionBackend) -> None:
    a = fb.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = fb.binary("mul", a, 2.0)
    c = fb.unary("neg", b)
    before = fb.stats.as_dict()
    out = fb.matmul(c, fb.reshape(b, (3, 2)))
    after = fb.stats.as_dict()
    assert type(out) is not FArray  # the inner backend's own handle: a value in memory needs no graph node
    assert after["fusion_boundaries"] - before["fusion_boundaries"] == 2  # reshape and matmul
    x = np.arange(6, dtype=np.float32).reshape(2, 3) * 2
    np.testing.assert_allclose(fb.to_numpy(out), -x @ x.reshape(3, 2))


class _Call:
    """The part of ember.extension.ExtensionCall the default (boundary) run_extension uses."""

    def __init__(self, args: tuple[Any, ...], stack: Any, kernel: Any) -> None:
        self.args, self.stack, self.kernel, self.kwargs = args, stack, kernel, {"alpha": 0.5}
        self.seen: list[Any] = []

    def with_args(self, args: Any, stack: Any = None) -> _Call:
        call = _Call(tuple(args), stack, self.kernel)
        call.seen = self.seen
        return call

    def run_kernel(self, backend: Any) -> Any:
        self.seen.append((backend, self.stack, tuple(type(a) for a in self.args)))
        return self.kernel(backend, *self.args, **self.kwargs)


def test_run_extension_is_a_boundary_on_realized_inputs(fb: FusionBackend) -> None:
    x = fb.from_numpy(np.arange(4, dtype=np.float32))
    y = fb.binary("mul", x, 3.0)  # pending
    assert y.node.value is None
    before = fb.stats.boundaries

    def axpy(backend: Any, a: Any, b: Any, tag: int, alpha: float) -> Any:
        assert tag == 7  # non-tensor arguments as given
        return backend.binary("add", backend.binary("mul", a, alpha), b)

    call = _Call((x, y, 7), fb, axpy)
    out = fb.run_extension(call)
    (backend, stack, types), = call.seen
    assert backend is fb.inner and stack is fb.inner  # the inner stack ran the kernel, on its own handles
    assert FArray not in types and types[2] is int
    assert y.node.value is not None and fb.stats.boundaries == before + 1
    assert type(out) is not FArray and fb.dtype_of(out) is dt.float32
    np.testing.assert_allclose(fb.to_numpy(out), np.arange(4) * 0.5 + np.arange(4) * 3)


def test_an_inherited_composition_is_recorded(interp_cls: Any) -> None:
    class NoSoftmax(interp_cls):  # type: ignore[misc, valid-type]
        softmax = Backend.softmax  # leave softmax to the default composition

    fb = FusionBackend(NoSoftmax())
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    before = fb.stats.recorded
    out = fb.softmax(fb.from_numpy(x), 1, False)
    assert out.node.value is None and fb.stats.recorded > before  # its primitives were recorded, not run
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(fb.to_numpy(out), e / e.sum(1, keepdims=True), rtol=1e-5)


def test_an_overridden_composition_is_the_inner_backend_s(fb: FusionBackend) -> None:
    x = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    before = fb.stats.boundaries
    out = fb.softmax(fb.from_numpy(x), 1, True)
    assert type(out) is not FArray and fb.stats.boundaries == before + 1
    np.testing.assert_allclose(fb.to_numpy(out), x - np.log(np.exp(x).sum(1, keepdims=True)), rtol=1e-5,
                               atol=1e-6)


def test_optional_inner_methods_are_boundaries(fb: FusionBackend) -> None:
    # autodiff over fusion looks up flex's conv_input_grad with getattr: it must arrive, as a boundary
    if not hasattr(fb.inner, "conv_input_grad"):
        pytest.skip("the inner backend has no conv_input_grad")
    rng = np.random.default_rng(2)
    gy, w = rng.standard_normal((1, 2, 3, 3)).astype(np.float32), rng.standard_normal((2, 1, 2, 2)).astype(np.float32)
    pending_gy = fb.binary("mul", fb.from_numpy(gy), 1.0)
    out = fb.conv_input_grad(pending_gy, fb.from_numpy(w), (1, 1, 4, 4), (1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    ref = fb.inner.conv_input_grad(fb.inner.from_numpy(gy), fb.inner.from_numpy(w), (1, 1, 4, 4), (1, 1),
                                   ((0, 0), (0, 0)), (1, 1), 1)
    assert type(out) is not FArray and "conv_input_grad" in vars(fb)
    np.testing.assert_allclose(fb.to_numpy(out), fb.inner.to_numpy(ref), rtol=1e-6)
    with pytest.raises(AttributeError):
        fb.no_such_method  # noqa: B018
