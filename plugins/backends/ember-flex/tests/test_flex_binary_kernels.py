"""Eager binary operators straight into flex's kernels (``Backend.binary_kernels``): the same results, dtypes and
typed errors as the checked path, for every shape case the short path meets (equal, broadcast, rank mismatch, 0-d,
one element, empty, not broadcastable), and ``binary`` still called where the kernels do not apply."""

from __future__ import annotations

import operator
import threading

import numpy as np
import pytest
import torch

import ember
from ember.errors import ShapeError
from ember_flex.backend import FlexBackend

OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "pow": operator.pow, "floor_divide": operator.floordiv, "remainder": operator.mod,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "bitwise_and": operator.and_, "bitwise_or": operator.or_, "bitwise_xor": operator.xor,
}
SHAPES = [((7,), (7,)), ((3, 1), (1, 4)), ((4,), (3, 4)), ((2, 3, 4), (4,)), ((), ()), ((1,), (1,)), ((), (5,)),
          ((5,), ()), ((0,), (0,)), ((2, 0), (1, 0)), ((6, 1), ())]
DTYPES = ["float32", "float64", "int32", "int64", "bool", "bfloat16"]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.startswith("int"):  # no zero: integer division by zero raises (on the checked path)
        return np.asarray(rng.integers(1, 9, shape), dtype=dtype)
    return np.asarray(rng.standard_normal(shape) + 2.0, dtype=np.float32)


def _defined(op: str, dtype: str) -> bool:
    """Whether PyTorch defines ``op`` on two ``dtype`` tensors (the refusals are the kit's error cases)."""
    if dtype == "bool":
        return op not in ("sub", "remainder", "floor_divide", "pow")
    if dtype in ("float32", "float64", "bfloat16"):
        return not op.startswith("bitwise")
    return True


@pytest.mark.parametrize(("op", "dtype"), [(op, d) for op in sorted(OPS) for d in DTYPES if _defined(op, d)])
def test_operators_match_torch_on_every_shape_case(op: str, dtype: str) -> None:
    rng = np.random.default_rng(0)
    dev = ember.Device.flex()
    fn = OPS[op]
    for sa, sb in SHAPES:
        a_np, b_np = _data(rng, sa, dtype), _data(rng, sb, dtype)
        ta, tb = (torch.from_numpy(x.copy()).to(getattr(torch, dtype)) for x in (a_np, b_np))
        ea, eb = (ember.tensor(x, device=dev).to(dtype=getattr(ember, dtype)) for x in (a_np, b_np))
        for _ in range(2):  # the first call learns the dtype through binary(), the second takes the short path
            got = fn(ea, eb)
            want = fn(ta, tb)
            assert tuple(got.shape) == tuple(want.shape), (op, dtype, sa, sb)
            assert got.dtype.name == str(want.dtype).removeprefix("torch."), (op, dtype, sa, sb)
            assert type(got._h) is np.ndarray, (op, dtype, sa, sb)  # never a numpy scalar, even 0-d
            np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=1e-2 if dtype == "bfloat16"
                                       else 1e-6, err_msg=f"{op} {dtype} {sa} {sb}")


@pytest.mark.parametrize("op", ["add", "mul", "lt"])
def test_shapes_that_do_not_broadcast_raise_the_typed_error(op: str) -> None:
    dev = ember.Device.flex()
    a, b = ember.ones(3, device=dev), ember.ones(4, device=dev)
    for _ in range(2):
        with pytest.raises(ShapeError, match=op):
            OPS[op](a, b)


class _CountingFlex(FlexBackend):
    """A flex subclass with its own binary: core must keep calling it."""

    calls = 0

    def binary(self, op, a, b):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return super().binary(op, a, b)


def test_a_subclass_with_its_own_binary_gets_no_kernels() -> None:
    assert _CountingFlex().binary_kernels is None
    be = FlexBackend()
    assert be.binary_kernels is not None and 1 < be.binary_kernel_elems


def test_large_operands_go_through_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = ember.Device.flex()
    stack = dev.stack
    n = stack.binary_kernel_elems
    seen: list[str] = []
    real = FlexBackend.binary

    def spy(self, op, a, b):  # type: ignore[no-untyped-def]
        seen.append(op)
        return real(self, op, a, b)

    monkeypatch.setattr(FlexBackend, "binary", spy)
    small, big = ember.ones(n - 1, device=dev), ember.ones(n, device=dev)
    assert np.array_equal((small + small).numpy(), np.full(n - 1, 2.0, np.float32))
    assert seen == []  # the kernel, no binary()
    assert np.array_equal((big + big).numpy(), np.full(n, 2.0, np.float32))
    assert seen == ["add"]  # the pool may chunk it: binary() decides


def test_short_path_from_several_threads() -> None:
    dev = ember.Device.flex()
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(100).astype(np.float32) for _ in range(8)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            a, b = ember.tensor(xs[i], device=dev), ember.tensor(xs[(i + 1) % 8], device=dev)
            for _ in range(200):
                assert np.array_equal((a * b).numpy(), xs[i] * xs[(i + 1) % 8])
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
