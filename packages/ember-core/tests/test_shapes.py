"""ember.shapes against numpy and PyTorch: broadcasting, dim normalisation, size arguments, pooling output sizes
and view strides. Where PyTorch raises, ember raises its typed error naming the op."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

import ember
from ember import shapes
from ember.errors import DimError, ShapeError
from ember.shapes import broadcast_shapes, check_shape_arg, norm_dim, norm_dims, pool_output_size, view_strides

torch = pytest.importorskip("torch")


def _torch_broadcast(*ss: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(*ss))
    except (RuntimeError, ValueError):
        return None


def _numpy_broadcast(*ss: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*ss))
    except ValueError:
        return None


def _ember_broadcast(*ss: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return broadcast_shapes(*ss, op="test_op")
    except ShapeError as e:
        assert str(e).startswith("test_op: "), e
        return None


# ------------------------------------------------------------------------------------------------------------------
# broadcast_shapes
# ------------------------------------------------------------------------------------------------------------------
CASES = [
    (), ((),), ((3,),), ((), ()), ((), (2, 3)), ((3, 1), (4,)), ((2, 1, 5), (1, 3, 1), (5,)), ((0, 1), (1, 4)),
    ((0,), (1,)), ((0,), (2,)), ((2,), (3,)), ((1,), (0,), (1, 1)), ((2, 3), (3, 2)), ((5, 1, 4), (3, 1)),
    ((1, 1, 1), ()), ((8, 1, 6, 1), (7, 1, 5)), ((2, 1), (1, 3), (4, 1, 1), (3,)), ((2, 1), (3,), (4,)),
]


@pytest.mark.parametrize("ss", CASES, ids=str)
def test_broadcast_matches_numpy_and_torch(ss: tuple[tuple[int, ...], ...]) -> None:
    ref = _numpy_broadcast(*ss)
    assert _torch_broadcast(*ss) == ref
    assert _ember_broadcast(*ss) == ref
    assert _ember_broadcast(*ss) == ref  # the second call is answered from the cache


def _random_shapes(rng: random.Random) -> tuple[tuple[int, ...], ...]:
    base = [rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(0, 4))]
    out = []
    for _ in range(rng.randint(1, 4)):
        s = [rng.choice([n, 1, 1, 2]) if rng.random() < 0.9 else rng.randint(0, 4) for n in base]
        out.append(tuple(s[rng.randint(0, len(s)):]))
    return tuple(out)


def test_broadcast_matches_numpy_and_torch_on_random_shapes() -> None:
    rng = random.Random(15)
    outcomes = set()
    for _ in range(600):
        ss = _random_shapes(rng)
        ref = _numpy_broadcast(*ss)
        assert _torch_broadcast(*ss) == ref, ss
        assert _ember_broadcast(*ss) == ref, ss
        outcomes.add(ref is None)
    assert outcomes == {True, False}  # both broadcastable and incompatible shapes were drawn


def test_broadcast_error_names_the_op_every_shape_and_the_dim() -> None:
    with pytest.raises(ShapeError, match=r"^add: shapes \(2, 3\) and \(4,\) are not broadcastable \(dim -1: 3 vs 4\)$"):
        broadcast_shapes((2, 3), (4,), op="add")
    with pytest.raises(ShapeError, match=r"^where: shapes \(2, 1\), \(3,\) and \(4,\) are not broadcastable "
                                         r"\(dim -1: 3 vs 4\)$"):
        broadcast_shapes((2, 1), (3,), (4,), op="where")
    with pytest.raises(ValueError):  # ShapeError is a ValueError, as numpy's error is
        broadcast_shapes((2,), (3,))
    with pytest.raises(ShapeError, match="^broadcast_shapes: "):  # the default op name
        broadcast_shapes((2,), (3,))


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty pair cache: sizes are validated when a pair is first seen (a cached pair is answered by value, and
    2.0 == 2), so the refusal tests must not find their pair cached by an earlier test."""
    monkeypatch.setattr(shapes, "_pair_cache", {})


@pytest.mark.parametrize("bad", [(-1,), (2, -3)], ids=["neg", "neg-inner"])
def test_broadcast_refuses_negative_sizes_as_torch(bad: tuple[int, ...], fresh_cache: None) -> None:
    with pytest.raises((ValueError, RuntimeError)):
        torch.broadcast_shapes(bad, (1,))
    with pytest.raises(ShapeError, match=r"^op: negative size -\d in shape"):
        broadcast_shapes(bad, (1,), op="op")


@pytest.mark.parametrize("bad", [(2.0,), (True, 2), ("2",), 3], ids=["float", "bool", "str", "not-a-sequence"])
def test_broadcast_refuses_non_int_sizes(bad: Any, fresh_cache: None) -> None:
    with pytest.raises(ShapeError, match="^op: "):
        broadcast_shapes(bad, (1,), op="op")


def test_broadcast_accepts_lists_and_numpy_ints_and_returns_python_ints() -> None:
    out = broadcast_shapes([np.int64(3), 1], (np.int32(4),))
    assert out == (3, 4) and all(type(n) is int for n in out)
    assert broadcast_shapes([2, 1], [1, 5]) == (2, 5)


def test_broadcast_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shapes, "_pair_cache", {})
    monkeypatch.setattr(shapes, "_PAIR_CACHE_LIMIT", 8)
    for n in range(1, 40):
        assert broadcast_shapes((n, 1), (1, n + 1)) == (n, n + 1)
    assert len(shapes._pair_cache) == 8
    assert broadcast_shapes((39, 1), (1, 40)) == (39, 40)  # past the limit results are still computed


def test_public_broadcast_shapes_is_pytorch_s() -> None:
    assert ember.broadcast_shapes((3, 1), (4,), 4) == tuple(torch.broadcast_shapes((3, 1), (4,), 4))
    assert ember.broadcast_shapes() == tuple(torch.broadcast_shapes())
    with pytest.raises(ShapeError, match="^broadcast_shapes: "):
        ember.broadcast_shapes((2,), (3,))


# ------------------------------------------------------------------------------------------------------------------
# norm_dim / norm_dims
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ndim", [0, 1, 2, 4])
def test_norm_dim_accepts_what_torch_accepts(ndim: int) -> None:
    x = torch.zeros((2,) * ndim)
    for dim in range(-6, 6):
        try:
            torch.sum(x, dim)
            expected: int | None = dim % max(ndim, 1)
        except IndexError:
            expected = None
        if expected is None:
            with pytest.raises(DimError, match=rf"^sum: dimension out of range \(expected to be in range of "
                                               rf"\[{-max(ndim, 1)}, {max(ndim, 1) - 1}\], but got {dim}\)$"):
                norm_dim(dim, ndim, "sum")
        else:
            assert norm_dim(dim, ndim, "sum") == expected
            assert norm_dim(np.int64(dim), ndim, "sum") == expected


@pytest.mark.parametrize("dim", [True, 1.0, "0", None], ids=["bool", "float", "str", "none"])
def test_norm_dim_refuses_non_ints(dim: Any) -> None:
    with pytest.raises(DimError, match="^flip: dim must be an int"):
        norm_dim(dim, 2, "flip")
    with pytest.raises(IndexError):  # DimError is an IndexError, as PyTorch's out-of-range dim error
        norm_dim(5, 2, "flip")


def test_norm_dims_forms() -> None:
    assert norm_dims(None, 3, "sum") == (0, 1, 2)
    assert norm_dims(-1, 3, "sum") == (2,)
    assert norm_dims((2, 0), 3, "sum") == (2, 0)  # the caller's order is kept
    assert norm_dims([-1, -3], 3, "sum") == (2, 0)
    assert norm_dims(range(2), 3, "sum") == (0, 1)
    assert norm_dims(0, 0, "sum") == () and norm_dims((-1,), 0, "sum") == ()
    with pytest.raises(DimError, match="^sum: dimension out of range"):
        norm_dims(1, 0, "sum")  # validated even for 0-d tensors


def test_norm_dims_refuses_repeats_as_torch() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        x.sum(dim=(0, -2))
    with pytest.raises(DimError, match=r"^sum: dim \(0, -2\) appears multiple times in the list of dims$"):
        norm_dims((0, -2), 2, "sum")
    with pytest.raises(DimError, match="^sum: dim must be an int or a sequence of ints, got float"):
        norm_dims(1.5, 2, "sum")


# ------------------------------------------------------------------------------------------------------------------
# check_shape_arg
# ------------------------------------------------------------------------------------------------------------------
class _Index:
    def __index__(self) -> int:
        return 3


@pytest.mark.parametrize("args, expected", [
    ((2, 3), (2, 3)), (((2, 3),), (2, 3)), (([2, 3],), (2, 3)), ((torch.Size([2, 3]),), (2, 3)),
    ((np.int64(2), np.int32(0)), (2, 0)), ((_Index(),), (3,)), ((), ()), (((),), ()),
], ids=["varargs", "tuple", "list", "torch.Size", "numpy-ints", "index", "none", "empty-tuple"])
def test_check_shape_arg_forms(args: tuple[Any, ...], expected: tuple[int, ...]) -> None:
    out = check_shape_arg(args, "zeros")
    assert out == expected and all(type(n) is int for n in out)
    if args:
        assert tuple(torch.zeros(*args).shape) == expected


@pytest.mark.parametrize("args, message", [
    ((2, -1), r"^zeros: negative dimension -1 in size \(2, -1\)$"),
    ((2.0, 3), r"^zeros: sizes must be ints, got float 2.0 in \(2.0, 3\)$"),
    ((True,), r"^zeros: sizes must be ints, got bool True"),
    (("2",), r"^zeros: sizes must be ints, got str '2'"),
], ids=["negative", "float", "bool", "str"])
def test_check_shape_arg_refuses_what_torch_refuses(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises((RuntimeError, TypeError)):
        torch.zeros(*args)
    with pytest.raises(ShapeError, match=message):
        check_shape_arg(args, "zeros")


# ------------------------------------------------------------------------------------------------------------------
# pool_output_size
# ------------------------------------------------------------------------------------------------------------------
def test_pool_output_size_matches_torch() -> None:
    F = torch.nn.functional
    checked = 0
    for n, k, s, p, d, ceil in itertools.product(range(1, 9), range(1, 4), range(1, 4), range(2), range(1, 3),
                                                 (False, True)):
        if p > k // 2:
            continue  # torch refuses padding over half the window
        x = torch.zeros(1, 1, n)
        try:
            ref = F.max_pool1d(x, k, s, p, d, ceil_mode=ceil).shape[-1]
        except RuntimeError:  # the window does not fit: torch refuses, ember's helper says 0 for callers to refuse
            assert pool_output_size(n, k, s, p, d, ceil) == 0
            continue
        assert pool_output_size(n, k, s, p, d, ceil) == ref, (n, k, s, p, d, ceil)
        if d == 1:
            assert F.avg_pool1d(x, k, s, p, ceil_mode=ceil).shape[-1] == ref
        checked += 1
    assert checked > 300


# ------------------------------------------------------------------------------------------------------------------
# view_strides
# ------------------------------------------------------------------------------------------------------------------
def _layouts(rng: random.Random) -> torch.Tensor:
    """A tensor with a random strided layout: a permutation, a step slice or an expand of a contiguous base."""
    shape = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4))]
    t = torch.zeros(shape)
    kind = rng.choice(["contiguous", "permute", "slice", "expand"])
    if kind == "permute":
        t = t.permute(*rng.sample(range(len(shape)), len(shape)))
    elif kind == "slice":
        d = rng.randrange(len(shape))
        t = t.narrow(d, 0, max(shape[d] - 1, 1)) if rng.random() < 0.5 else t.transpose(0, -1)[::2]
    elif kind == "expand":
        t = t[..., :1].expand(*shape[:-1], 3)
    return t


def _factorisations(numel: int, rng: random.Random) -> list[tuple[int, ...]]:
    divs = [v for v in range(1, numel + 1) if numel % v == 0] if numel else [0, 1, 2]
    out = [(numel,), (1, numel), (numel, 1)]
    for _ in range(4):
        a = rng.choice(divs)
        b = numel // a if a else rng.choice([1, 3])
        out.append((a, b))
        out.append((a, 1, b))
    return out


def test_view_strides_matches_torch_view() -> None:
    rng = random.Random(15)
    views = refusals = 0
    for _ in range(400):
        t = _layouts(rng)
        for new in _factorisations(t.numel(), rng):
            got = view_strides(tuple(t.shape), t.stride(), new)
            try:
                ref = t.view(new).stride()
            except RuntimeError:
                assert got is None, (tuple(t.shape), t.stride(), new)
                refusals += 1
                continue
            assert got == ref, (tuple(t.shape), t.stride(), new)
            views += 1
    assert views > 100 and refusals > 20  # both outcomes were exercised


@pytest.mark.parametrize("shape, strides, new", [
    ((0, 3), (3, 1), (3, 0)), ((0, 3), (3, 1), (0,)), ((), (), (1, 1)), ((1,), (1,), ()), ((1, 1), (5, 7), (1,)),
    ((2, 1, 3), (3, 9, 1), (6,)), ((2, 3), (1, 2), (6,)),
], ids=["empty", "empty-1d", "0d-to-2d", "to-0d", "ones", "unit-dim-stride", "transposed"])
def test_view_strides_edge_layouts(shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]) -> None:
    base = torch.zeros(max(sum((n - 1) * st for n, st in zip(shape, strides)) + 1, 1)).as_strided(shape, strides)
    try:
        expected: tuple[int, ...] | None = base.view(new).stride()
    except RuntimeError:
        expected = None
    assert view_strides(shape, strides, new) == expected
