"""Conformance: matmul in every rank combination (batch broadcasting included), mm/bmm/mv/dot, einsum."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.testing import assert_close, noncontiguous, require_dtype, to_torch, torch_or_skip

# (shape a, shape b): every rank combination from 1-d to 4-d, with batch broadcasting
MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (3,)),
    ((3,), (5, 3, 4)),
    ((5, 2, 3), (3, 4)),
    ((2, 3), (5, 3, 4)),
    ((5, 2, 3), (5, 3, 4)),
    ((1, 2, 3), (5, 3, 4)),
    ((5, 1, 2, 3), (4, 3, 2)),
    ((2, 1, 2, 3), (1, 6, 3, 1)),
    ((0, 3), (3, 4)),
    ((2, 0), (0, 4)),
    ((2, 3), (3, 0)),
    ((0,), (0,)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("d", [dt.float32, dt.float64, dt.int64, dt.int32], ids=str)
def test_matmul_matches_numpy(device, rng, shapes, d):
    require_dtype(device, d)
    sa, sb = shapes
    if d.is_floating_point:
        a, b = rng.standard_normal(sa).astype(d.numpy), rng.standard_normal(sb).astype(d.numpy)
    else:
        a, b = rng.integers(-5, 5, sa).astype(d.numpy), rng.integers(-5, 5, sb).astype(d.numpy)
    ea, eb = ember.tensor(a, device=device), ember.tensor(b, device=device)
    want = np.matmul(a, b)
    assert_close(ember.matmul(ea, eb), np.asarray(want), rtol=1e-5 if d is dt.float32 else None,
                 atol=1e-5 if d is dt.float32 else None, msg=f"matmul{sa}x{sb}")
    assert_close(ea @ eb, np.asarray(want), rtol=1e-5, atol=1e-5, msg="@ operator")
    if len(sa) >= 2 and len(sb) >= 2:
        assert_close(noncontiguous(a, device) @ noncontiguous(b, device), np.asarray(want), rtol=1e-5,
                     atol=1e-5, msg=f"non-contiguous matmul{sa}x{sb}")


@pytest.mark.parametrize("d", [dt.float16, dt.bfloat16], ids=str)
def test_matmul_half_types(device, rng, d):
    torch = torch_or_skip()
    require_dtype(device, d)
    a = ember.tensor(rng.standard_normal((4, 8)).astype(d.numpy), device=device)
    b = ember.tensor(rng.standard_normal((8, 3)).astype(d.numpy), device=device)
    want = (to_torch(a).float() @ to_torch(b).float()).to(getattr(torch, d.name))
    assert_close(a @ b, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "sa,sb,pattern",
    [
        ((2, 3), (4, 5), r"matmul: shapes \(2, 3\) and \(4, 5\) cannot be multiplied \(3 != 4\)"),
        ((3,), (4,), r"matmul: shapes \(3,\) and \(4,\)"),
        ((2, 2, 3), (3, 3, 4), r"matmul: shapes \(2,\) and \(3,\) are not broadcastable"),
        ((), (3,), r"matmul: both arguments need at least 1 dimension"),
    ],
    ids=str,
)
def test_matmul_shape_errors(device, sa, sb, pattern):
    a, b = ember.ones(sa, device=device), ember.ones(sb, device=device)
    with pytest.raises(ember.ShapeError, match=pattern):
        ember.matmul(a, b)


def test_matmul_dtype_and_type_errors(device):
    a = ember.ones(2, 2, device=device)
    with pytest.raises(ember.DTypeError, match=r"matmul: expected both operands to have the same dtype.*int64"):
        a @ ember.ones(2, 2, dtype=ember.int64, device=device)
    with pytest.raises(ember.DTypeError, match="matmul: not implemented for bool"):
        ember.ones(2, 2, dtype=ember.bool_, device=device) @ ember.ones(2, 2, dtype=ember.bool_, device=device)
    with pytest.raises(ember.DTypeError, match="matmul: expected Tensors"):
        ember.matmul(a, [[1.0, 0.0], [0.0, 1.0]])


def test_mm_bmm_mv_dot(device, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    v = rng.standard_normal(4).astype(np.float32)
    ba = rng.standard_normal((2, 3, 4)).astype(np.float32)
    bb = rng.standard_normal((2, 4, 5)).astype(np.float32)
    E = lambda x: ember.tensor(x, device=device)  # noqa: E731
    tol = {"rtol": 1e-5, "atol": 1e-5}
    assert_close(ember.mm(E(a), E(b)), a @ b, **tol)
    assert_close(E(a).mm(E(b)), a @ b, **tol)
    assert_close(ember.bmm(E(ba), E(bb)), ba @ bb, **tol)
    assert_close(ember.mv(E(a), E(v)), a @ v, **tol)
    assert_close(ember.dot(E(v), E(v)), np.asarray(v @ v), **tol)
    with pytest.raises(ember.ShapeError, match=r"mm: expected 2-d tensors, got shapes \(4,\)"):
        ember.mm(E(v), E(b))
    with pytest.raises(ember.ShapeError, match="bmm: expected 3-d tensors with equal batch size"):
        ember.bmm(E(ba), E(bb[:1]))
    with pytest.raises(ember.ShapeError, match="mv"):
        ember.mv(E(a), E(a))
    with pytest.raises(ember.ShapeError, match="dot: expected 1-d tensors"):
        ember.dot(E(a), E(v))


def test_outer(device):
    if not hasattr(ember.Tensor, "reshape"):
        pytest.skip("outer needs Tensor.reshape (ember.ops.shape)")
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0, 5.0], np.float32)
    assert_close(ember.outer(ember.tensor(a, device=device), ember.tensor(b, device=device)), np.outer(a, b))


EINSUM = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("i,i->", [(4,), (4,)]),
    ("i,j->ij", [(2,), (3,)]),
    ("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("i j , j k -> i k", [(2, 3), (3, 4)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM, ids=[e for e, _ in EINSUM])
def test_einsum_matches_torch(device, rng, eq, shapes):
    torch = torch_or_skip()
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ops = [ember.tensor(a, device=device) for a in arrays]
    want = torch.einsum(eq, *[torch.from_numpy(a) for a in arrays])
    assert_close(ember.einsum(eq, *ops), want, rtol=1e-5, atol=1e-5, msg=eq)
    assert_close(ember.einsum(eq, ops), want, rtol=1e-5, atol=1e-5, msg=f"{eq} (operands as a list)")


@pytest.mark.requires_dtype("float64")
def test_einsum_promotes_dtypes(device):
    torch = torch_or_skip()
    a = ember.ones(2, 3, device=device)
    b = ember.ones(3, dtype=ember.float64, device=device)
    r = ember.einsum("ij,j->i", a, b)
    assert_close(r, torch.einsum("ij,j->i", to_torch(a).double(), to_torch(b)))


@pytest.mark.parametrize(
    "eq,shapes,error,pattern",
    [
        ("ij,jk->ik", [(2, 3)], ember.ValueRangeError, "has 2 operands but 1 were given"),
        ("ij,jk->ik", [(2, 3), (4, 5)], ember.ShapeError, "subscript 'j' has size 4"),
        ("ijk->i", [(2, 3)], ember.ShapeError, r"subscript 'ijk' does not match operand of shape \(2, 3\)"),
        ("ij->iz", [(2, 3)], ember.ValueRangeError, "output subscript 'z'"),
        ("i1->i", [(2, 3)], ember.ValueRangeError, "invalid subscript"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_einsum_errors(device, eq, shapes, error, pattern):
    ops = [ember.ones(s, device=device) for s in shapes]
    with pytest.raises(error, match=pattern):
        ember.einsum(eq, *ops)
    with pytest.raises(ember.DTypeError, match="einsum"):
        ember.einsum("i->i", [1, 2])
