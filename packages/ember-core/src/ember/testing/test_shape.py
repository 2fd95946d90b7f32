"""Conformance: the shape and movement ops on the device under test, against PyTorch: results, view/copy
semantics (observed by writing through views), non-contiguous and empty inputs, and every error path (type and
message)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember import DimError, DTypeError, IndexOutOfRangeError, ShapeError, Tensor, ValueRangeError
from ember.ops import shape as shape_ops
from ember.testing import torch_or_skip
from ember.testing._helpers import NC, elsewhere, need, rx, shares

torch = torch_or_skip()


def data(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.asarray(np.arange(int(np.prod(shape))).reshape(shape) * 1.5 - 2, dtype=dtype)


def both(arr: np.ndarray) -> list[Tensor]:
    return [ember.tensor(arr), NC(arr)]


def check(e: Any, t: Any) -> None:
    if isinstance(t, (tuple, list)):
        assert isinstance(e, tuple), type(e)
        assert len(e) == len(t)
        for a, b in zip(e, t):
            check(a, b)
        return
    assert isinstance(e, Tensor)
    assert e.shape == tuple(t.shape), (e.shape, tuple(t.shape))
    assert e.dtype.name == str(t.dtype).replace("torch.", "")
    np.testing.assert_array_equal(e.numpy(), t.numpy())


# ----------------------------------------------------------------------------------------------------
# reshape / view / flatten
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 4), (-1,), (2, -1, 3), (24,), (4, 3, 2), (1, 24, 1)])
def test_reshape(shape: tuple[int, ...]) -> None:
    a = data(2, 3, 4)
    want = torch.from_numpy(a).reshape(shape)
    for x in both(a):
        check(x.reshape(shape), want)
        check(x.reshape(*shape), want)
        check(ember.reshape(x, shape), want)


def test_reshape_views_and_copies() -> None:
    x = ember.tensor(data(2, 3, 4))
    y = x.reshape(6, 4)
    assert shares(x, y)
    y[0, 0] = 100.0
    assert x[0, 0, 0].item() == 100.0
    nc = NC(data(3, 4))
    assert not shares(nc, nc.reshape(-1))  # not viewable: a copy, as torch
    check(ember.tensor(5.0).reshape(1, 1), torch.tensor(5.0).reshape(1, 1))
    check(ember.zeros(0, 3).reshape(3, 0), torch.zeros(0, 3).reshape(3, 0))
    check(ember.zeros(0, 3).reshape(3, -1), torch.zeros(0, 3).reshape(3, -1))


def test_reshape_errors() -> None:
    x = ember.zeros(2, 3)
    with pytest.raises(ShapeError, match=rx("shape '[2, 5]' is invalid for input of size 6")):
        x.reshape(2, 5)
    with pytest.raises(ShapeError, match="only one dimension can be inferred"):
        x.reshape(-1, -1)
    with pytest.raises(ShapeError, match=rx("shape '[4, -1]' is invalid for input of size 6")):
        x.reshape(4, -1)
    with pytest.raises(ShapeError, match="invalid shape dimension -2"):
        x.reshape(-2, 3)
    with pytest.raises(ShapeError, match="can be any value and is ambiguous"):
        ember.zeros(0, 3).reshape(0, -1, 2)
    with pytest.raises(DTypeError, match="sizes must be an int, got float"):
        x.reshape(2.0, 3)
    with pytest.raises(DTypeError, match="reshape: expected a Tensor, got list"):
        ember.reshape([1, 2], (2,))


def test_view() -> None:
    a = data(2, 3, 4)
    x = ember.tensor(a)
    v = x.view(6, 4)
    assert shares(x, v)
    check(v, torch.from_numpy(a).view(6, 4))
    check(x.view(-1), torch.from_numpy(a).view(-1))
    check(x.view_as(ember.zeros(4, 6)), torch.from_numpy(a).view(4, 6))
    # transposed: merging the swapped dims is not viewable, splitting a dim is
    t = x.transpose(1, 2)
    tt = torch.from_numpy(a).transpose(1, 2)
    check(t.view(2, 4, 3, 1), tt.view(2, 4, 3, 1))
    check(t.view(2, 2, 2, 3), tt.view(2, 2, 2, 3))
    assert shares(x, t.view(2, 2, 2, 3))
    with pytest.raises(RuntimeError):
        tt.view(2, 12)
    with pytest.raises(
        ShapeError,
        match=rx("view size [2, 12] is not compatible with input tensor's size [2, 4, 3] and stride"),
    ) as info:
        t.view(2, 12)
    assert "Use .reshape(...) instead" in str(info.value)
    # a stride-0 (expanded) dim can be viewed as long as it is not merged with others
    e = ember.zeros(3).expand(2, 3)
    check(e.view(2, 3, 1), torch.zeros(3).expand(2, 3).view(2, 3, 1))
    with pytest.raises(ShapeError, match="not compatible"):
        e.view(6)
    with pytest.raises(ember.UnsupportedError, match="view\\(dtype\\)"):
        x.view(ember.int32)


def test_reshape_as_ravel() -> None:
    a = data(3, 4)
    check(ember.tensor(a).reshape_as(ember.zeros(2, 6)), torch.from_numpy(a).reshape_as(torch.zeros(2, 6)))
    for x in both(a):
        check(x.ravel(), torch.from_numpy(a).ravel())


@pytest.mark.parametrize(("s", "e"), [(0, -1), (1, 2), (0, 1), (2, 2), (-2, -1), (1, -1)])
def test_flatten(s: int, e: int) -> None:
    a = data(2, 3, 4)
    for x in both(a):
        check(x.flatten(s, e), torch.from_numpy(a).flatten(s, e))
        check(
            ember.flatten(x, start_dim=s, end_dim=e),
            torch.flatten(torch.from_numpy(a), start_dim=s, end_dim=e),
        )


def test_flatten_edge_and_errors() -> None:
    check(ember.tensor(3.0).flatten(), torch.tensor(3.0).flatten())
    check(ember.zeros(0, 2).flatten(), torch.zeros(0, 2).flatten())
    with pytest.raises(DimError, match=rx("flatten: start_dim (2) cannot come after end_dim (1)")):
        ember.zeros(2, 3, 4).flatten(2, 1)
    with pytest.raises(
        DimError, match=rx("dimension out of range (expected to be in range of [-3, 2], but got 3)")
    ):
        ember.zeros(2, 3, 4).flatten(3)


def test_unflatten() -> None:
    a = data(2, 12)
    for x in both(a):
        check(x.unflatten(1, (3, 4)), torch.from_numpy(a).unflatten(1, (3, 4)))
        check(x.unflatten(-1, (2, -1, 3)), torch.from_numpy(a).unflatten(-1, (2, -1, 3)))
    with pytest.raises(
        ShapeError, match=rx("provided sizes [5, 2] don't multiply up to the size of dim 1 (12)")
    ):
        ember.tensor(a).unflatten(1, (5, 2))
    with pytest.raises(ShapeError, match="sizes must be non-empty"):
        ember.tensor(a).unflatten(1, ())


# ----------------------------------------------------------------------------------------------------
# permutations
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("perm", [(2, 0, 1), (0, 1, 2), (-1, -2, -3), (1, 0, 2)])
def test_permute(perm: tuple[int, ...]) -> None:
    a = data(2, 3, 4)
    want = torch.from_numpy(a).permute(perm)
    for x in both(a):
        check(x.permute(*perm), want)
        check(x.permute(perm), want)
        check(ember.permute(x, perm), want)
    x = ember.tensor(a)
    assert shares(x, x.permute(perm))


def test_permute_errors() -> None:
    x = ember.zeros(2, 3)
    with pytest.raises(DimError, match="the tensor has 2 dims .* but 3 dims were given"):
        x.permute(0, 1, 2)
    with pytest.raises(DimError, match="repeated dim in permute"):
        x.permute(0, 0)
    with pytest.raises(DimError, match="repeated dim in permute"):
        x.permute(1, -1)
    with pytest.raises(DimError, match="dimension out of range"):
        x.permute(0, 2)


@pytest.mark.filterwarnings("ignore:The use of `x.T` on tensors")
def test_transpose_family() -> None:
    a = data(2, 3, 4)
    t = torch.from_numpy(a)
    for x in both(a):
        check(x.transpose(0, 2), t.transpose(0, 2))
        check(ember.transpose(x, -1, 1), torch.transpose(t, -1, 1))
        check(x.swapaxes(0, 1), t.swapaxes(0, 1))
        check(ember.swapdims(x, 1, 2), torch.swapdims(t, 1, 2))
        check(x.transpose(1, 1), t.transpose(1, 1))
        check(x.T, t.permute(2, 1, 0))
        check(x.mT, t.mT)
    x = ember.tensor(a)
    assert shares(x, x.transpose(0, 1))
    check(ember.tensor(2.0).transpose(0, -1), torch.tensor(2.0).transpose(0, -1))
    with pytest.raises(DimError, match="dimension out of range"):
        x.transpose(0, 3)


@pytest.mark.filterwarnings("ignore:The use of `x.T` on tensors")
def test_t_and_properties() -> None:
    a = data(3, 4)
    for x in both(a):
        check(x.t(), torch.from_numpy(a).t())
        check(ember.t(x), torch.t(torch.from_numpy(a)))
        check(x.T, torch.from_numpy(a).T)
    check(ember.tensor(data(5)).t(), torch.from_numpy(data(5)).t())
    check(ember.tensor(data(5)).T, torch.from_numpy(data(5)).T)
    check(ember.tensor(1.0).t(), torch.tensor(1.0).t())
    assert isinstance(Tensor.T, property) and isinstance(Tensor.mT, property)
    with pytest.raises(ShapeError, match="t: expects a tensor with <= 2 dimensions, but got a 3-d tensor"):
        ember.zeros(2, 3, 4).t()
    with pytest.raises(ShapeError, match=rx("mT: tensor must have at least 2 dimensions, got shape [3]")):
        ember.zeros(3).mT  # noqa: B018


@pytest.mark.parametrize(("src", "dst"), [(0, 2), (-1, 0), ((0, 1), (2, 0)), ([2, 0], [0, 1]), (1, 1)])
def test_movedim(src: Any, dst: Any) -> None:
    a = data(2, 3, 4)
    for x in both(a):
        check(x.movedim(src, dst), torch.from_numpy(a).movedim(src, dst))
        check(ember.moveaxis(x, src, dst), torch.moveaxis(torch.from_numpy(a), src, dst))


def test_movedim_errors() -> None:
    x = ember.zeros(2, 3, 4)
    with pytest.raises(ValueRangeError, match="should contain the same number of dims as destination"):
        x.movedim((0, 1), (1,))
    with pytest.raises(DimError, match="appears multiple times"):
        x.movedim((0, 0), (1, 2))
    with pytest.raises(DimError, match="dimension out of range"):
        x.movedim(3, 0)


# ----------------------------------------------------------------------------------------------------
# squeeze / unsqueeze / atleast
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [None, 0, 2, -1, (0, 2), (1,), (0, 1, 2, 3)])
def test_squeeze(dim: Any) -> None:
    a = data(1, 3, 1, 2)
    want = torch.from_numpy(a).squeeze() if dim is None else torch.from_numpy(a).squeeze(dim)
    for x in both(a):
        check(x.squeeze(dim), want)
        check(ember.squeeze(x, dim), want)
    x = ember.tensor(a)
    assert shares(x, x.squeeze())
    check(ember.tensor(4.0).squeeze(), torch.tensor(4.0).squeeze())
    check(ember.tensor(4.0).squeeze(0), torch.tensor(4.0).squeeze(0))


def test_squeeze_errors() -> None:
    with pytest.raises(DimError, match="dimension out of range"):
        ember.zeros(1, 2).squeeze(2)
    with pytest.raises(DimError, match="appears multiple times"):
        ember.zeros(1, 2).squeeze((0, 0))


@pytest.mark.parametrize("dim", [0, 1, 3, -1, -4])
def test_unsqueeze(dim: int) -> None:
    a = data(2, 3, 4)
    for x in both(a):
        check(x.unsqueeze(dim), torch.from_numpy(a).unsqueeze(dim))
    x = ember.tensor(a)
    assert shares(x, x.unsqueeze(dim))
    v = NC(a).unsqueeze(dim)
    v[(0,) * 4] = 99.0  # still a view of a non-contiguous tensor
    check(ember.tensor(1.0).unsqueeze(0), torch.tensor(1.0).unsqueeze(0))
    with pytest.raises(DimError, match=rx("expected to be in range of [-4, 3], but got 4")):
        x.unsqueeze(4)


def test_atleast() -> None:
    for a in (np.float32(2.0), data(3), data(2, 3), data(2, 3, 4)):
        ta = torch.tensor(a)
        check(ember.atleast_1d(ember.tensor(a)), torch.atleast_1d(ta))
        check(ember.atleast_2d(ember.tensor(a)), torch.atleast_2d(ta))
        check(ember.atleast_3d(ember.tensor(a)), torch.atleast_3d(ta))
    got = ember.atleast_2d(ember.tensor(1.0), ember.tensor(data(3)))
    check(got, torch.atleast_2d(torch.tensor(1.0), torch.from_numpy(data(3))))


# ----------------------------------------------------------------------------------------------------
# expand / broadcast / repeat / tile
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [(3, 4), (2, 3, 4), (-1, 4), (2, -1, -1), (3, 1), (0, 3, 4)])
def test_expand(sizes: tuple[int, ...]) -> None:
    a = data(3, 1)
    want = torch.from_numpy(a).expand(*sizes)
    for x in both(a):
        check(x.expand(*sizes), want)
        check(x.expand(sizes), want)
        check(ember.broadcast_to(x, sizes), torch.broadcast_to(torch.from_numpy(a), sizes))
    x = ember.tensor(a)
    assert shares(x, x.expand(*sizes)) or 0 in sizes
    check(x.expand_as(ember.zeros(2, 3, 5)), torch.from_numpy(a).expand_as(torch.zeros(2, 3, 5)))
    check(ember.tensor(1.5).expand(2, 2), torch.tensor(1.5).expand(2, 2))


def test_expand_errors() -> None:
    x = ember.zeros(3, 1)
    with pytest.raises(
        ShapeError,
        match=rx(
            "the expanded size of the tensor (4) must match the existing size (3) at "
            "non-singleton dimension 0.  Target sizes: [4, 2].  Tensor sizes: "
            "[3, 1]"
        ),
    ):
        x.expand(4, 2)
    with pytest.raises(
        ShapeError,
        match=rx(
            "the number of sizes provided (1) must be greater or equal to the number "
            "of dimensions in the tensor (2)"
        ),
    ):
        x.expand(3)
    with pytest.raises(ShapeError, match="isn't allowed in a leading, non-existing dimension 0"):
        x.expand(-1, 3, 2)
    with pytest.raises(ShapeError, match="invalid size -2"):
        x.expand(-2, 1)
    with pytest.raises(ShapeError, match="broadcast_to: the expanded size"):
        ember.broadcast_to(x, (2, 2))


def test_broadcast_tensors_and_shapes() -> None:
    a, b, c = data(3, 1), data(4), np.float32(2.0)
    want = torch.broadcast_tensors(torch.from_numpy(a), torch.from_numpy(b), torch.tensor(c))
    got = ember.broadcast_tensors(ember.tensor(a), NC(b) if b.ndim > 1 else ember.tensor(b), ember.tensor(c))
    check(got, want)
    check(
        ember.broadcast_tensors([ember.tensor(a), ember.tensor(b)]),
        torch.broadcast_tensors(torch.from_numpy(a), torch.from_numpy(b)),
    )
    assert ember.broadcast_shapes((3, 1), (4,), 4) == tuple(torch.broadcast_shapes((3, 1), (4,), 4))
    with pytest.raises(
        ShapeError, match=r"broadcast_tensors: shapes \(3, 1\) and \(2, 2\) are not broadcastable"
    ):
        ember.broadcast_tensors(ember.tensor(a), ember.zeros(2, 2))
    with pytest.raises(ShapeError, match="not broadcastable"):
        ember.broadcast_shapes((2,), (3,))


@pytest.mark.parametrize("reps", [(2, 3), (1, 1), (2, 1, 2), (0, 2), (3, 1, 1, 1), (1, 2)])
def test_repeat(reps: tuple[int, ...]) -> None:
    a = data(2, 3)
    want = torch.from_numpy(a).repeat(*reps)
    for x in both(a):
        r = x.repeat(*reps)
        check(r, want)
        check(x.repeat(reps), want)
        assert not shares(x, r)
        if r.numel():
            r[(0,) * r.ndim] = 123.0  # the result owns writable memory
    check(ember.tensor(1.0).repeat(3), torch.tensor(1.0).repeat(3))
    check(ember.zeros(1, 1).repeat(3, 1), torch.zeros(1, 1).repeat(3, 1))


def test_repeat_tile_errors_and_tile() -> None:
    a = data(2, 3)
    with pytest.raises(
        ShapeError,
        match=rx(
            "number of dimensions of repeat dims (1) can not be smaller than number "
            "of dimensions of tensor (2)"
        ),
    ):
        ember.tensor(a).repeat(2)
    with pytest.raises(ValueRangeError, match="repeats must be non-negative"):
        ember.tensor(a).repeat(-1, 2)
    for reps in ((2,), (2, 2), (2, 1, 3)):
        check(ember.tile(ember.tensor(a), reps), torch.tile(torch.from_numpy(a), reps))
        check(NC(a).tile(reps), torch.from_numpy(a).tile(reps))


# ----------------------------------------------------------------------------------------------------
# flip / roll
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dims", [(0,), (1, 2), (-1,), [0, 1, 2], ()])
def test_flip(dims: Any) -> None:
    a = data(2, 3, 4)
    for x in both(a):
        r = x.flip(dims)
        check(r, torch.from_numpy(a).flip(dims))
        assert not shares(x, r)
    check(ember.fliplr(ember.tensor(a)), torch.fliplr(torch.from_numpy(a)))
    check(ember.flipud(ember.tensor(a)), torch.flipud(torch.from_numpy(a)))


def test_flip_errors() -> None:
    with pytest.raises(DimError, match="appears multiple times"):
        ember.zeros(2, 3).flip((0, 0))
    with pytest.raises(ShapeError, match="fliplr: input must be >= 2-d"):
        ember.fliplr(ember.zeros(3))
    with pytest.raises(ShapeError, match="flipud: input must be >= 1-d"):
        ember.flipud(ember.tensor(1.0))


@pytest.mark.parametrize(
    ("shifts", "dims"), [(1, 0), (-2, 1), (5, None), ((1, 2), (0, 1)), (7, -1), (0, 1), ((-1, 3), (1, 1))]
)
def test_roll(shifts: Any, dims: Any) -> None:
    a = data(3, 4)
    want = torch.roll(torch.from_numpy(a), shifts, dims)
    for x in both(a):
        r = ember.roll(x, shifts, dims)
        check(r, want)
        assert not shares(x, r)
    check(ember.roll(ember.zeros(0, 3), 2, 0), torch.roll(torch.zeros(0, 3), 2, 0))


def test_roll_errors() -> None:
    with pytest.raises(ValueRangeError, match="shifts and dimensions must align. shifts: 2, dims: 1"):
        ember.zeros(2, 3).roll((1, 2), (0,))
    with pytest.raises(DimError, match="dimension out of range"):
        ember.zeros(2, 3).roll(1, 2)


# ----------------------------------------------------------------------------------------------------
# narrow / select / split / chunk / unbind
# ----------------------------------------------------------------------------------------------------
def test_narrow_select() -> None:
    a = data(4, 5)
    t = torch.from_numpy(a)
    for x in both(a):
        check(x.narrow(1, 1, 3), t.narrow(1, 1, 3))
        check(ember.narrow(x, 0, -2, 2), torch.narrow(t, 0, -2, 2))
        check(x.narrow(0, 4, 0), t.narrow(0, 4, 0))
        check(x.narrow(0, ember.tensor(1), 2), t.narrow(0, torch.tensor(1), 2))
        check(x.select(1, -1), t.select(1, -1))
        check(ember.select(x, 0, 2), torch.select(t, 0, 2))
    x = ember.tensor(a)
    n = x.narrow(1, 1, 2)
    n[:] = 0.0
    assert x[:, 1:3].numpy().sum() == 0.0  # narrow is a view


def test_narrow_select_errors() -> None:
    x = ember.zeros(4, 6)
    with pytest.raises(IndexOutOfRangeError, match=rx("start (5) + length (2) exceeds dimension size (6).")):
        x.narrow(1, 5, 2)
    with pytest.raises(
        IndexOutOfRangeError, match=rx("start out of range (expected to be in range of [-6, 6], but got 7)")
    ):
        x.narrow(1, 7, 0)
    with pytest.raises(ValueRangeError, match="length must be non-negative"):
        x.narrow(0, 0, -1)
    with pytest.raises(DimError, match="narrow: cannot be applied to a 0-dim tensor"):
        ember.tensor(1.0).narrow(0, 0, 1)
    with pytest.raises(
        IndexOutOfRangeError, match="select: index 4 is out of bounds for dimension 0 with size 4"
    ):
        x.select(0, 4)


@pytest.mark.parametrize("arg", [2, 3, 7, [1, 4, 2], [0, 7], (3, 0, 4)])
def test_split(arg: Any) -> None:
    a = data(7, 2)
    want = torch.split(torch.from_numpy(a), arg)
    for x in both(a):
        check(ember.split(x, arg), want)
    want1 = torch.from_numpy(a.T.copy()).split(arg, dim=1)
    check(ember.tensor(a.T.copy()).split(arg, dim=1), want1)
    x = ember.tensor(a)
    p = x.split(arg)[0]
    if p.numel():
        p[0, 0] = 77.0
        assert x[0, 0].item() == 77.0  # pieces are views


def test_split_edge_and_errors() -> None:
    check(ember.split(ember.zeros(0, 2), 0), torch.split(torch.zeros(0, 2), 0))
    check(ember.split(ember.zeros(0, 2), 3), torch.split(torch.zeros(0, 2), 3))
    x = ember.zeros(6)
    with pytest.raises(ShapeError, match=rx("split_with_sizes expects split_sizes to sum exactly to 6")):
        x.split([2, 3])
    with pytest.raises(ShapeError, match=rx("but got split_sizes=[7, -1]")):
        x.split([7, -1])
    with pytest.raises(
        ValueRangeError, match="split_size can only be 0 if dimension size is 0, but got dimension size of 6"
    ):
        x.split(0)
    with pytest.raises(ValueRangeError, match="split_size must be non-negative"):
        x.split(-1)
    with pytest.raises(DimError, match="split: cannot split a 0-d tensor"):
        ember.tensor(1.0).split(1)


@pytest.mark.parametrize(("n", "chunks"), [(7, 3), (6, 3), (5, 5), (3, 5), (0, 3), (6, 4), (1, 1)])
def test_chunk(n: int, chunks: int) -> None:
    a = data(n, 2) if n else np.zeros((0, 2), np.float32)
    want = torch.chunk(torch.from_numpy(a), chunks)
    for x in both(a):
        check(ember.chunk(x, chunks), want)
    check(ember.tensor(a.T.copy()).chunk(chunks, -1), torch.from_numpy(a.T.copy()).chunk(chunks, -1))
    with pytest.raises(ValueRangeError, match="expects `chunks` to be greater than 0, got: 0"):
        ember.chunk(ember.tensor(a), 0)


@pytest.mark.parametrize("arg", [3, 1, 8, [1, 4], [2, 2], [5, 1], [-2], (0, 9)])
def test_tensor_split(arg: Any) -> None:
    a = data(7, 2)
    for x in both(a):
        check(ember.tensor_split(x, arg), torch.tensor_split(torch.from_numpy(a), arg))
    check(ember.tensor(a).tensor_split(arg, dim=0), torch.from_numpy(a).tensor_split(arg, dim=0))
    with pytest.raises(ValueRangeError, match="number of sections must be larger than 0"):
        ember.tensor_split(ember.tensor(a), 0)


def test_unbind() -> None:
    a = data(3, 2, 4)
    for d in (0, 1, -1):
        for x in both(a):
            check(x.unbind(d), torch.from_numpy(a).unbind(d))
    x = ember.tensor(a)
    x.unbind(0)[1][:] = 0.0
    assert x[1].numpy().sum() == 0.0
    with pytest.raises(DimError, match="unbind: dimension specified as 0 but tensor has no dimensions"):
        ember.tensor(1.0).unbind()


# ----------------------------------------------------------------------------------------------------
# cat / stack
# ----------------------------------------------------------------------------------------------------
def test_cat() -> None:
    a, b = data(2, 3), data(4, 3) + 100
    t = torch.cat([torch.from_numpy(a), torch.from_numpy(b)])
    check(ember.cat([ember.tensor(a), NC(b)]), t)
    check(
        ember.cat((ember.tensor(a.T.copy()), ember.tensor(b.T.copy())), dim=-1),
        torch.cat((torch.from_numpy(a.T.copy()), torch.from_numpy(b.T.copy())), dim=-1),
    )
    check(ember.concat([ember.tensor(a)], 0), torch.concat([torch.from_numpy(a)], 0))
    check(
        ember.concatenate([ember.tensor(a), ember.tensor(a)], axis=1),
        torch.concatenate([torch.from_numpy(a), torch.from_numpy(a)], axis=1),
    )
    single = ember.tensor(a)
    assert not shares(single, ember.cat([single]))  # always a new tensor


@pytest.mark.parametrize(
    ("da", "db"),
    [
        (np.int32, np.float32),
        (np.int64, np.float16),
        (np.bool_, np.int8),
        (np.uint8, np.int8),
        (np.float32, np.float64),
    ],
)
def test_cat_promotes(da: Any, db: Any) -> None:
    need(da)
    need(db)
    a, b = data(2, 2, dtype=da), data(1, 2, dtype=db)
    check(
        ember.cat([ember.tensor(a), ember.tensor(b)]), torch.cat([torch.from_numpy(a), torch.from_numpy(b)])
    )


def test_cat_skips_legacy_empty() -> None:
    a = data(2, 3)
    need(np.float64)
    e = np.zeros((0,), np.float64)
    want = torch.cat([torch.from_numpy(e), torch.from_numpy(a), torch.from_numpy(e)], 1)
    check(ember.cat([ember.tensor(e), ember.tensor(a), ember.tensor(e)], 1), want)
    check(
        ember.cat([ember.tensor(e), ember.tensor(e)]), torch.cat([torch.from_numpy(e), torch.from_numpy(e)])
    )
    check(
        ember.cat([ember.zeros(0, 3), ember.tensor(a)]), torch.cat([torch.zeros(0, 3), torch.from_numpy(a)])
    )


def test_cat_errors() -> None:
    with pytest.raises(
        ShapeError,
        match=rx(
            "sizes of tensors must match except in dimension 0. Expected size 3 but "
            "got size 4 for tensor number 1 in the list (shapes [2, 3] and [2, 4], "
            "dim 1)"
        ),
    ):
        ember.cat([ember.zeros(2, 3), ember.zeros(2, 4)])
    with pytest.raises(
        ShapeError,
        match=rx(
            "tensors must have same number of dimensions: got 2 (tensor 0, shape "
            "[2, 3]) and 3 (tensor 1, shape [1, 2, 3])"
        ),
    ):
        ember.cat([ember.zeros(2, 3), ember.zeros(1, 2, 3)])
    with pytest.raises(
        ShapeError, match="zero-dimensional tensor \\(at position 1\\) cannot be concatenated"
    ):
        ember.cat([ember.zeros(2), ember.tensor(1.0)])
    with pytest.raises(ValueRangeError, match="expected a non-empty list of Tensors"):
        ember.cat([])
    with pytest.raises(DTypeError, match="expected a sequence of Tensors, got Tensor"):
        ember.cat(ember.zeros(2))
    with pytest.raises(DTypeError, match="expected Tensors, got list at position 1"):
        ember.cat([ember.zeros(2), [1.0]])
    with pytest.raises(DimError, match="dimension out of range"):
        ember.cat([ember.zeros(2, 3)], 2)
    other = elsewhere(ember.zeros(2))
    with pytest.raises(ember.DeviceError, match="cat: expected all tensors on the same device"):
        ember.cat([ember.zeros(2), other])


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack(dim: int) -> None:
    a, b = data(2, 3), data(2, 3) + 50
    want = torch.stack([torch.from_numpy(a), torch.from_numpy(b)], dim)
    check(ember.stack([ember.tensor(a), NC(b)], dim), want)
    check(
        ember.stack([ember.tensor(1.0), ember.tensor(2.0)]),
        torch.stack([torch.tensor(1.0), torch.tensor(2.0)]),
    )


def test_stack_errors() -> None:
    with pytest.raises(
        ShapeError,
        match=rx(
            "stack: expects each tensor to be equal size, but got [2, 3] at entry 0 and [2, 4] at entry 1"
        ),
    ):
        ember.stack([ember.zeros(2, 3), ember.zeros(2, 4)])
    with pytest.raises(DimError, match="dimension out of range"):
        ember.stack([ember.zeros(2, 3)], 3)


def test_hstack_vstack_dstack_column_stack() -> None:
    for shapes in (((3,), (2,)), ((2, 3), (2, 1)), ((1.0,), (1.0,))):
        arrs = [data(*s) if isinstance(s[0], int) else np.float32(2.0) for s in shapes]
        if all(np.ndim(a) == 1 for a in arrs) or all(np.ndim(a) == 0 for a in arrs):
            check(
                ember.hstack([ember.tensor(a) for a in arrs]), torch.hstack([torch.tensor(a) for a in arrs])
            )
        elif arrs[0].shape[0] == arrs[1].shape[0]:
            check(
                ember.hstack([ember.tensor(a) for a in arrs]), torch.hstack([torch.tensor(a) for a in arrs])
            )
    for arrs in ((data(3), data(3)), (data(2, 3), data(3)), (np.float32(1), np.float32(2))):
        check(ember.vstack([ember.tensor(a) for a in arrs]), torch.vstack([torch.tensor(a) for a in arrs]))
        check(ember.row_stack([ember.tensor(a) for a in arrs]), torch.vstack([torch.tensor(a) for a in arrs]))
        if np.ndim(arrs[0]) == np.ndim(arrs[1]):
            check(
                ember.dstack([ember.tensor(a) for a in arrs]), torch.dstack([torch.tensor(a) for a in arrs])
            )
    arrs = (data(3), data(3, 2))
    check(
        ember.column_stack([ember.tensor(a) for a in arrs]),
        torch.column_stack([torch.tensor(a) for a in arrs]),
    )
    with pytest.raises(ShapeError, match="sizes of tensors must match"):
        ember.vstack([ember.zeros(3), ember.zeros(4)])


# ----------------------------------------------------------------------------------------------------
# triangles, diagonals, meshgrid, unfold
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, -1, 3, -5])
def test_tril_triu(k: int) -> None:
    a = data(2, 3, 4)
    for x in both(a):
        check(x.tril(k), torch.from_numpy(a).tril(k))
        check(ember.triu(x, diagonal=k), torch.triu(torch.from_numpy(a), diagonal=k))
    ints = data(4, 4, dtype=np.int64)
    check(ember.tril(ember.tensor(ints), k), torch.tril(torch.from_numpy(ints), k))
    with pytest.raises(
        ShapeError, match=rx("tril: input tensor must have at least 2 dimensions, got shape [3]")
    ):
        ember.zeros(3).tril()


@pytest.mark.parametrize(
    ("off", "d1", "d2"), [(0, 0, 1), (1, 0, 1), (-1, 0, 1), (0, 1, 2), (2, -1, 0), (9, 0, 1), (-2, 2, 1)]
)
def test_diagonal(off: int, d1: int, d2: int) -> None:
    a = data(3, 4, 5)
    for x in both(a):
        check(x.diagonal(off, d1, d2), torch.from_numpy(a).diagonal(off, d1, d2))
    with pytest.raises(
        DimError, match="diagonal dimensions cannot be identical|dimensions cannot be identical"
    ):
        ember.tensor(a).diagonal(0, 1, 1)
    with pytest.raises(ShapeError, match="diagonal: input must have at least 2 dimensions"):
        ember.zeros(3).diagonal()


@pytest.mark.parametrize("k", [0, 1, -2])
def test_diag_and_diag_embed(k: int) -> None:
    v = data(3)
    m = data(3, 4)
    check(ember.diag(ember.tensor(v), k), torch.diag(torch.from_numpy(v), k))
    check(ember.tensor(m).diag(k), torch.from_numpy(m).diag(k))
    b = data(2, 3)
    check(ember.diag_embed(ember.tensor(b), k), torch.diag_embed(torch.from_numpy(b), k))
    check(ember.diag_embed(ember.tensor(b), k, 0, 2), torch.diag_embed(torch.from_numpy(b), k, 0, 2))
    with pytest.raises(ShapeError, match="diag: supports 1-d or 2-d tensors, got a 3-d tensor"):
        ember.diag(ember.zeros(2, 2, 2))


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing: str) -> None:
    a, b, c = data(3), data(4), data(2)
    want = torch.meshgrid(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c), indexing=indexing)
    check(ember.meshgrid(ember.tensor(a), ember.tensor(b), ember.tensor(c), indexing=indexing), want)
    want2 = torch.meshgrid([torch.from_numpy(a), torch.tensor(np.float32(1.0))], indexing=indexing)
    check(ember.meshgrid([ember.tensor(a), ember.tensor(np.float32(1.0))], indexing=indexing), want2)
    check(
        ember.meshgrid(ember.tensor(a), indexing=indexing),
        torch.meshgrid(torch.from_numpy(a), indexing=indexing),
    )


def test_meshgrid_errors() -> None:
    with pytest.raises(ValueRangeError, match="indexing must be 'ij' or 'xy', got 'ab'"):
        ember.meshgrid(ember.zeros(2), indexing="ab")
    with pytest.raises(ShapeError, match="meshgrid: expects 0-d or 1-d tensors"):
        ember.meshgrid(ember.zeros(2, 2))
    with pytest.raises(DTypeError, match="same dtype, got float32 and int64"):
        ember.meshgrid(ember.zeros(2), ember.arange(3))


@pytest.mark.parametrize(
    ("dim", "size", "step"), [(0, 2, 1), (1, 3, 2), (-1, 4, 1), (2, 1, 3), (1, 5, 5), (0, 0, 1)]
)
def test_unfold(dim: int, size: int, step: int) -> None:
    a = data(3, 5, 4)
    for x in both(a):
        check(x.unfold(dim, size, step), torch.from_numpy(a).unfold(dim, size, step))
    check(ember.tensor(2.0).unfold(0, 1, 1), torch.tensor(2.0).unfold(0, 1, 1))


def test_unfold_errors() -> None:
    x = ember.zeros(3, 5)
    with pytest.raises(ShapeError, match="maximum size for tensor at dimension 1 is 5 but size is 6"):
        x.unfold(1, 6, 1)
    with pytest.raises(ValueRangeError, match="step is 0 but must be > 0"):
        x.unfold(1, 2, 0)
    with pytest.raises(ValueRangeError, match="size is -1 but must be >= 0"):
        x.unfold(1, -1, 1)
    with pytest.raises(DimError, match="dimension out of range"):
        x.unfold(2, 1, 1)


# ----------------------------------------------------------------------------------------------------
# module conventions
# ----------------------------------------------------------------------------------------------------
def test_exports_and_methods() -> None:
    for name in shape_ops.__all__:
        assert getattr(ember, name) is getattr(shape_ops, name), name
    for name, fn in shape_ops.TENSOR_METHODS.items():
        assert getattr(Tensor, name) is fn, name
    # PyTorch has these as functions too, with the same names
    for name in (
        "reshape",
        "permute",
        "transpose",
        "squeeze",
        "unsqueeze",
        "flatten",
        "cat",
        "stack",
        "split",
        "chunk",
        "tril",
        "triu",
        "roll",
        "flip",
        "narrow",
        "movedim",
        "meshgrid",
        "diag",
        "t",
    ):
        assert hasattr(torch, name) and name in shape_ops.__all__, name
