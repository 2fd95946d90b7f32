"""``ember.linalg.*`` from ember-linalg: torch.linalg's signatures, defaults and numerics.

This module is published as the ``linalg`` namespace (``register_namespaces``): ``ember.linalg.cholesky`` is
:func:`cholesky` here, while core's own ``ember.linalg.matmul`` and ``ember.linalg.vector_norm`` stay core's.
Decompositions and solvers are extension ops (LAPACK on the host: in place on flex, a copy to and from the host on
other backends) with vjps; the norms and products are compositions of ember ops and of those ops, differentiated
through them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

import ember
from ember import dtypes as dt
from ember.errors import DTypeError, ShapeError, ValueRangeError

from . import (
    _opencl,  # noqa: F401 - registers the OpenCL device kernels (cholesky, triangular solve, LU)
    _ops,
)
from ._base import LinAlgError, batch_index, call

Tensor = ember.Tensor

__all__ = [
    "LinAlgError", "cholesky", "cholesky_ex", "cond", "cross", "det", "diagonal", "eig", "eigh", "eigvals",
    "eigvalsh", "householder_product", "inv", "inv_ex", "lstsq", "lu", "lu_factor", "lu_factor_ex", "lu_solve",
    "matrix_exp", "matrix_norm", "matrix_power", "matrix_rank", "multi_dot", "norm", "pinv", "qr", "slogdet",
    "solve", "solve_ex", "solve_triangular", "svd", "svdvals", "tensorinv", "tensorsolve", "vander", "vecdot",
]


# -- result types (torch.return_types' field names) -------------------------------------------------------------------
class SlogdetResult(NamedTuple):
    sign: Tensor
    logabsdet: Tensor


class InvExResult(NamedTuple):
    inverse: Tensor
    info: Tensor


class SolveExResult(NamedTuple):
    result: Tensor
    info: Tensor


class CholeskyExResult(NamedTuple):
    L: Tensor
    info: Tensor


class EighResult(NamedTuple):
    eigenvalues: Tensor
    eigenvectors: Tensor


EigResult = EighResult


class SVDResult(NamedTuple):
    U: Tensor
    S: Tensor
    Vh: Tensor


class QRResult(NamedTuple):
    Q: Tensor
    R: Tensor


class LstsqResult(NamedTuple):
    solution: Tensor
    residuals: Tensor
    rank: Tensor
    singular_values: Tensor


class LUResult(NamedTuple):
    P: Tensor
    L: Tensor
    U: Tensor


class LUFactorResult(NamedTuple):
    LU: Tensor
    pivots: Tensor


class LUFactorExResult(NamedTuple):
    LU: Tensor
    pivots: Tensor
    info: Tensor


# -- helpers ----------------------------------------------------------------------------------------------------------
def _tensor(fn: str, x: Any, name: str = "A") -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"linalg.{fn}: {name} must be a Tensor, got {type(x).__name__}")
    return x


def _is_vector_rhs(A: Tensor, B: Tensor) -> bool:
    """torch's linalg_solve_is_vector_rhs: B is a (batch of) vector(s) when 1-D or of shape A.shape[:-1]."""
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))


def _info_array(info: Tensor) -> np.ndarray:
    return np.asarray(info.detach().numpy())


def _tol(x: Any) -> float | None:
    """atol/rtol given as a number or a 0-dim tensor, as a float (None stays None)."""
    if x is None:
        return None
    if isinstance(x, Tensor):
        if x.ndim != 0:
            raise ShapeError(f"linalg: atol/rtol tensors must be 0-dimensional here, got shape {x.shape}")
        return float(x.item())
    return float(x)


# -- solvers and inverses ---------------------------------------------------------------------------------------------
def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
    """X with ``A X = B`` (``left=True``) or ``X A = B``, for square A ``(*, n, n)`` and B ``(*, n, k)`` or ``(*, n)``;
    batch dims broadcast. A singular A raises :class:`LinAlgError` naming the batch element."""
    A, B = _tensor("solve", A), _tensor("solve", B, "B")
    vector = _is_vector_rhs(A, B)
    if not left:
        A = A.mT
    if vector:
        return call(_ops.solve, A, B.unsqueeze(-1)).squeeze(-1)
    if not left:
        return call(_ops.solve, A, B.mT).mT
    return call(_ops.solve, A, B)


def solve_ex(A: Tensor, B: Tensor, *, left: bool = True, check_errors: bool = False) -> SolveExResult:
    """(result, info) of :func:`solve`: info is 0, or > 0 for a singular matrix (whose result is NaN); with
    ``check_errors=True`` a singular matrix raises :class:`LinAlgError` as :func:`solve` does."""
    A = _tensor("solve_ex", A)
    inv_a, info = call(_ops.inv_ex, A)
    bad = _info_array(info)
    if check_errors and bad.any():
        k = int(np.flatnonzero(bad.reshape(-1))[0])
        raise LinAlgError(f"linalg.solve_ex: {batch_index(tuple(A.shape), k)}The solver failed because the input "
                          "matrix is singular.")
    if bad.any():  # NaN for the singular elements (their inverse is NaN), the solve of the others
        return SolveExResult(_solve_masked(A, B, left), info)
    return SolveExResult(solve(A, B, left=left), info)


def _solve_masked(A: Tensor, B: Tensor, left: bool) -> Tensor:
    # X = A^{-1} B through inv_ex (NaN rows for singular elements), so a singular batch element does not raise
    Ai, _ = call(_ops.inv_ex, A)
    vector = _is_vector_rhs(A, B)
    if vector:
        return (Ai @ B.unsqueeze(-1)).squeeze(-1) if left else (B.unsqueeze(-2) @ Ai).squeeze(-2)
    return Ai @ B if left else B @ Ai


def inv(A: Tensor) -> Tensor:
    """The inverse of square matrices A ``(*, n, n)``; a singular one raises :class:`LinAlgError` (torch's message,
    naming the batch element and the zero pivot)."""
    return call(_ops.inv, _tensor("inv", A))


def inv_ex(A: Tensor, *, check_errors: bool = False) -> InvExResult:
    """(inverse, info): info (int32, A's batch shape) is 0 where A is invertible, else the 1-based index of the
    zero pivot (that inverse is NaN). ``check_errors=True`` raises :class:`LinAlgError` instead."""
    A = _tensor("inv_ex", A)
    out, info = call(_ops.inv_ex, A)
    if check_errors:
        bad = _info_array(info)
        if bad.any():
            k = int(np.flatnonzero(bad.reshape(-1))[0])
            raise LinAlgError(f"linalg.inv_ex: {batch_index(tuple(A.shape), k)}The diagonal element "
                              f"{int(bad.reshape(-1)[k])} is zero, the inversion could not be completed because "
                              "the input matrix is singular.")
    return InvExResult(out, info)


def det(A: Tensor) -> Tensor:
    """The determinant of square matrices A ``(*, n, n)``, shape A.shape[:-2]; differentiable also at singular A."""
    return call(_ops.det, _tensor("det", A))


def slogdet(A: Tensor) -> SlogdetResult:
    """(sign, logabsdet) with det(A) = sign * exp(logabsdet); singular A gives (0, -inf)."""
    return SlogdetResult(*call(_ops.slogdet, _tensor("slogdet", A)))


def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
    """The Cholesky factor of symmetric positive-definite A (only its lower triangle is read): L lower with
    A = L L^T, or with ``upper=True`` U = L^T. A non-positive-definite matrix raises :class:`LinAlgError`."""
    return call(_ops.cholesky, _tensor("cholesky", A), upper=upper)


def cholesky_ex(A: Tensor, *, upper: bool = False, check_errors: bool = False) -> CholeskyExResult:
    """(L, info): info (int32) is 0 where A is positive-definite, else the order of the first leading minor that
    is not; ``check_errors=True`` raises :class:`LinAlgError` instead."""
    A = _tensor("cholesky_ex", A)
    L, info = call(_ops.cholesky_ex, A, upper=upper)
    if check_errors:
        bad = _info_array(info)
        if bad.any():
            k = int(np.flatnonzero(bad.reshape(-1))[0])
            raise LinAlgError(f"linalg.cholesky_ex: {batch_index(tuple(A.shape), k)}The factorization could not be "
                              f"completed because the input is not positive-definite (the leading minor of order "
                              f"{int(bad.reshape(-1)[k])} is not positive-definite).")
    return CholeskyExResult(L, info)


def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> Tensor:
    """X with ``A X = B`` (``left``) or ``X A = B`` for triangular A ``(*, n, n)``, reading only A's upper (``upper``)
    or lower triangle, with an implicit unit diagonal when ``unitriangular``. B is ``(*, n, k)`` (left) or
    ``(*, k, n)``."""
    A, B = _tensor("solve_triangular", A), _tensor("solve_triangular", B, "B")
    return call(_ops.solve_triangular, A, B, upper=bool(upper), left=bool(left), unitriangular=bool(unitriangular))


# -- spectral decompositions ------------------------------------------------------------------------------------------
def eigh(A: Tensor, UPLO: str = "L") -> EighResult:
    """(eigenvalues ascending, eigenvectors as columns) of symmetric A, reading its ``UPLO`` triangle.

    Gradients: eigenvalue-only losses are differentiable everywhere; through the eigenvectors the gradient divides by
    eigenvalue gaps, so it is inf/NaN for repeated eigenvalues (as torch documents), and eigenvectors are only
    defined up to sign.
    """
    return EighResult(*call(_ops.eigh, _tensor("eigh", A), UPLO=UPLO))


def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:
    """The eigenvalues (ascending) of symmetric A; differentiable for repeated eigenvalues too."""
    return call(_ops.eigvalsh, _tensor("eigvalsh", A), UPLO=UPLO)


def eig(A: Tensor) -> EigResult:
    """(eigenvalues, eigenvectors) of a general square matrix: complex outputs, available when ember has complex
    dtypes; otherwise :class:`ember.errors.UnsupportedError` names the limitation (use :func:`eigh` for symmetric
    matrices). Differentiable (torch's rule); a loss that depends on the eigenvectors' phase raises
    :class:`ember.errors.AutodiffError`."""
    A = _tensor("eig", A)
    out = _ops.eig.output_spec(A)[0].dtype
    if out.is_complex and not A.device.supports_dtype(out):  # a real A's results are complex: the device stores them?
        raise DTypeError(f"linalg.eig: the result dtype {out.name} is not supported by backend "
                         f"{A.device.stack.base_backend.name!r} (device {A.device}); the eigenvalues of a real matrix "
                         "are complex in general: run on a device with complex dtypes (flex), or use linalg.eigh for "
                         "symmetric matrices")
    return EigResult(*call(_ops.eig, A))


def eigvals(A: Tensor) -> Tensor:
    """The eigenvalues of a general square matrix (complex; see :func:`eig`)."""
    return eig(A)[0]


def svd(A: Tensor, full_matrices: bool = True, *, driver: str | None = None) -> SVDResult:
    """(U, S, Vh) with A = U diag(S) Vh, singular values descending (LAPACK gesdd).

    Gradients through U or Vh are not defined for repeated singular values (the singular vectors' gauge): a
    UserWarning says so when it happens; losses of S alone are always differentiable.
    """
    if driver is not None:
        raise ValueRangeError(f"linalg.svd: driver= is only supported on CUDA inputs in torch, got {driver!r}")
    return SVDResult(*call(_ops.svd, _tensor("svd", A), full_matrices=bool(full_matrices)))


def svdvals(A: Tensor, *, driver: str | None = None) -> Tensor:
    """The singular values of A ``(*, m, n)``, descending, shape ``(*, min(m, n))``."""
    if driver is not None:
        raise ValueRangeError(f"linalg.svdvals: driver= is only supported on CUDA inputs in torch, got {driver!r}")
    return call(_ops.svdvals, _tensor("svdvals", A))


def qr(A: Tensor, mode: str = "reduced") -> QRResult:
    """(Q, R) with A = Q R: ``mode='reduced'`` (Q m x k, R k x n), ``'complete'`` (Q m x m, R m x n) or ``'r'``
    (an empty Q; not differentiable)."""
    return QRResult(*call(_ops.qr, _tensor("qr", A), mode=mode))


# -- least squares, pseudo-inverse, rank ------------------------------------------------------------------------------
def lstsq(A: Tensor, B: Tensor, rcond: float | None = None, *, driver: str | None = None) -> LstsqResult:
    """The least-squares solution of ``A X = B`` with torch's outputs per driver (default ``'gelsy'``):
    residuals for m > n with 'gels'/'gelsd'/'gelss', rank for all but 'gels', singular values for 'gelsd'/'gelss'
    (empty tensors otherwise). The solution is differentiable (through the pseudo-inverse, as torch)."""
    A, B = _tensor("lstsq", A), _tensor("lstsq", B, "B")
    vector = _is_vector_rhs(A, B)
    res = call(_ops.lstsq, A, B.unsqueeze(-1) if vector else B, rcond=rcond, driver=driver)
    x = res[0].squeeze(-1) if vector else res[0]
    return LstsqResult(x, res[1].squeeze(-1) if vector and res[1].ndim > 1 else res[1], res[2], res[3])


def pinv(A: Tensor, *, atol: Any = None, rtol: Any = None, hermitian: bool = False) -> Tensor:
    """The Moore-Penrose pseudo-inverse: singular values at or below max(atol, rtol * s_max) count as zero; rtol
    defaults to eps * max(m, n) when atol is not given (torch's rule). ``hermitian=True`` uses eigh."""
    return call(_ops.pinv, _tensor("pinv", A), atol=_tol(atol), rtol=_tol(rtol), hermitian=bool(hermitian))


def matrix_rank(A: Tensor, *, atol: Any = None, rtol: Any = None, hermitian: bool = False) -> Tensor:
    """The numerical rank (int64): singular values above max(atol, rtol * s_max), with :func:`pinv`'s defaults.
    An integer result, so never differentiable (as torch's)."""
    return call(_ops.matrix_rank, _tensor("matrix_rank", A), atol=_tol(atol), rtol=_tol(rtol),
                hermitian=bool(hermitian))


# -- LU ---------------------------------------------------------------------------------------------------------------
def lu_factor_ex(A: Tensor, *, pivot: bool = True, check_errors: bool = False) -> LUFactorExResult:
    """(LU, pivots, info) of LAPACK getrf (partial pivoting): L and U packed in LU, 1-based int32 pivots, info
    0 or the 1-based index of U's first zero diagonal element."""
    A = _tensor("lu_factor_ex", A)
    LU, piv, info = call(_ops.lu_factor_ex, A, pivot=pivot)
    if check_errors:
        _lu_check("lu_factor_ex", A, info)
    return LUFactorExResult(LU, piv, info)


def _lu_check(fn: str, A: Tensor, info: Tensor) -> None:
    bad = _info_array(info)
    if bad.any():
        k = int(np.flatnonzero(bad.reshape(-1))[0])
        i = int(bad.reshape(-1)[k])
        raise LinAlgError(f"linalg.{fn}: {batch_index(tuple(A.shape), k)}U[{i},{i}] is zero and using it on lu_solve "
                          "would result in a division by zero. If you still want to perform the factorization, "
                          "consider calling linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)")


def lu_factor(A: Tensor, *, pivot: bool = True) -> LUFactorResult:
    """(LU, pivots) of A = P L U; a zero pivot raises :class:`LinAlgError` as torch does (use
    :func:`lu_factor_ex` or :func:`lu` for singular matrices)."""
    A = _tensor("lu_factor", A)
    LU, piv, info = call(_ops.lu_factor_ex, A, pivot=pivot)
    _lu_check("lu_factor", A, info)
    return LUFactorResult(LU, piv)


def lu(A: Tensor, *, pivot: bool = True) -> LUResult:
    """(P, L, U) with A = P L U for A ``(*, m, n)``: P a permutation (m x m), L unit lower (m x k), U upper (k x n),
    k = min(m, n). Differentiable (also for rectangular A)."""
    A = _tensor("lu", A)
    LU, piv, _ = call(_ops.lu_factor_ex, A, pivot=pivot)
    return LUResult(*_ops.unpack(LU, piv))


def lu_solve(LU: Tensor, pivots: Tensor, B: Tensor, *, left: bool = True, adjoint: bool = False) -> Tensor:
    """X with op(A) X = B (``left``) or X op(A) = B from :func:`lu_factor`'s (LU, pivots); op(A) = A^T when
    ``adjoint``. Differentiable in LU and B."""
    LU, B = _tensor("lu_solve", LU, "LU"), _tensor("lu_solve", B, "B")
    return call(_ops.lu_solve, LU, _tensor("lu_solve", pivots, "pivots"), B, left=bool(left), adjoint=bool(adjoint))


# -- norms ------------------------------------------------------------------------------------------------------------
def _norm_dims(fn: str, A: Tensor, dim: Sequence[int]) -> tuple[int, int]:
    if len(tuple(dim)) != 2:
        raise ShapeError(f"linalg.{fn}: dim must be a 2-tuple, got {dim!r}")
    d0, d1 = (int(d) % A.ndim if -A.ndim <= int(d) < A.ndim else None for d in dim)
    if d0 is None or d1 is None:
        raise ShapeError(f"linalg.{fn}: dim {tuple(dim)} out of range for a tensor of shape {A.shape}")
    if d0 == d1:
        raise ShapeError(f"linalg.{fn}: dims must be different, got {tuple(dim)}")
    return d0, d1


def _float_input(fn: str, A: Tensor, dtype: Any) -> Tensor:
    """A as a float32/float64/complex64/complex128 tensor (cast to ``dtype`` first: complex for complex input, as
    torch requires), or a typed error naming the function."""
    if dtype is not None:
        want = dt.as_dtype(dtype)
        if A.dtype.is_complex and not want.is_complex:
            raise DTypeError(f"linalg.{fn}: dtype should be complex for complex inputs, but got {want.name}")
        A = A.to(want)
    if A.dtype not in (dt.float32, dt.float64, dt.complex64, dt.complex128):
        raise DTypeError(f"linalg.{fn}: Expected a floating point or complex tensor (float32, float64, complex64 or "
                         f"complex128) as input. Got {A.dtype.name} (shape {A.shape})")
    return A


def matrix_norm(A: Tensor, ord: Any = "fro", dim: Sequence[int] = (-2, -1), keepdim: bool = False, *,
                dtype: Any = None) -> Tensor:
    """The matrix norm over ``dim``: ``'fro'``, ``'nuc'``, ``2``/``-2`` (largest/smallest singular value),
    ``1``/``-1`` (max/min column abs-sum), ``inf``/``-inf`` (max/min row abs-sum). Differentiable."""
    A = _tensor("matrix_norm", A)
    if A.ndim < 2:
        raise ShapeError(f"linalg.matrix_norm: The input tensor A must have at least 2 dimensions, got {A.shape}")
    A = _float_input("matrix_norm", A, dtype)
    d0, d1 = _norm_dims("matrix_norm", A, dim)
    if ord == "fro":
        return ember.linalg.vector_norm(A, 2, dim=(d0, d1), keepdim=keepdim)
    if ord == "nuc" or ord in (2, -2):
        s = svdvals(A.movedim((d0, d1), (-2, -1)))
        out = s.sum(-1) if ord == "nuc" else (s.amax(-1) if ord == 2 else s.amin(-1))
        if keepdim:
            for d in sorted((d0, d1)):
                out = out.unsqueeze(d)
        return out
    if ord in (1, -1, math.inf, -math.inf):
        # ord=±1: sum over rows (d0) then max/min over columns; ord=±inf: the transpose
        inner, outer = (d0, d1) if ord in (1, -1) else (d1, d0)
        sums = A.abs().sum(dim=inner, keepdim=True)
        red = sums.amax(dim=outer, keepdim=True) if ord > 0 else sums.amin(dim=outer, keepdim=True)
        return red if keepdim else red.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    raise ValueRangeError(f"linalg.matrix_norm: Order {ord!r} not supported (expected 'fro', 'nuc', 2, -2, 1, -1, "
                          "inf or -inf)")


def norm(A: Tensor, ord: Any = None, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """torch.linalg.norm: a vector norm when ``dim`` is an int (or A is 1-D), a matrix norm when ``dim`` is a
    2-tuple (or A is 2-D with an ``ord``); with neither ``dim`` nor ``ord``, the 2-norm of A flattened."""
    A = _tensor("norm", A)
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if len(dims) == 1:
            return ember.linalg.vector_norm(A, 2 if ord is None else ord, dim=dims[0], keepdim=keepdim, dtype=dtype)
        return matrix_norm(A, "fro" if ord is None else ord, dim=dims, keepdim=keepdim, dtype=dtype)
    if ord is None:
        return ember.linalg.vector_norm(A, 2, keepdim=keepdim, dtype=dtype)
    if A.ndim == 1:
        return ember.linalg.vector_norm(A, ord, dim=0, keepdim=keepdim, dtype=dtype)
    if A.ndim == 2:
        return matrix_norm(A, ord, keepdim=keepdim, dtype=dtype)
    raise ShapeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. Got "
                     f"{A.ndim}D (shape {A.shape})")


def cond(A: Tensor, p: Any = None) -> Tensor:
    """The condition number of A in norm ``p``: for None/2/-2 the ratio of extreme singular values (any shape);
    for 'fro', 'nuc', ±1, ±inf ``matrix_norm(A, p) * matrix_norm(inv(A), p)`` (square A; inf when singular)."""
    A = _tensor("cond", A)
    if A.ndim < 2:
        raise ShapeError(f"linalg.cond: The input tensor A must have at least 2 dimensions, got {A.shape}")
    if p is None or p in (2, -2):
        s = svdvals(A)
        return s[..., 0] / s[..., -1] if p != -2 else s[..., -1] / s[..., 0]
    if A.shape[-1] != A.shape[-2]:
        raise ShapeError(f"linalg.cond: A must be batches of square matrices for p={p!r}, but they are "
                         f"{A.shape[-2]} by {A.shape[-1]} matrices")
    Ai, info = call(_ops.inv_ex, A)
    out = matrix_norm(A, p) * matrix_norm(Ai, p)
    return ember.where(info != 0, math.inf, out)


# -- products and helpers ---------------------------------------------------------------------------------------------
def matrix_power(A: Tensor, n: int) -> Tensor:
    """A^n for square A by repeated squaring; n = 0 gives the identity, n < 0 the power of inv(A)."""
    A = _tensor("matrix_power", A)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ShapeError(f"linalg.matrix_power: A must be batches of square matrices, got shape {A.shape}")
    if not isinstance(n, int) or isinstance(n, bool):
        raise DTypeError(f"linalg.matrix_power: n must be an int, got {type(n).__name__}")
    if n == 0:
        eye = ember.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        return eye.expand(*A.shape) if A.ndim > 2 else eye
    if n < 0:
        A, n = inv(A), -n
    result: Tensor | None = None
    base = A
    while True:
        if n & 1:
            result = base if result is None else result @ base
        n >>= 1
        if not n:
            break
        base = base @ base
    assert result is not None
    return result


def matrix_exp(A: Tensor) -> Tensor:
    """The matrix exponential of square A ``(*, n, n)``; differentiable (torch's block-matrix rule)."""
    return call(_ops.matrix_exp, _tensor("matrix_exp", A))


def cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:  # noqa: A002 - torch's parameter name
    """The cross product of 3-vectors along ``dim`` (inputs broadcast)."""
    a, b = _tensor("cross", input, "input"), _tensor("cross", other, "other")
    if a.ndim != b.ndim:
        raise ShapeError(f"linalg.cross: inputs must have the same number of dimensions, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    shape = tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    a, b = a.expand(*shape), b.expand(*shape)
    if not -len(shape) <= dim < len(shape) or shape[dim] != 3:
        raise ShapeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {tuple(input.shape)} and "
                         f"{tuple(other.shape)}")
    a0, a1, a2 = (a.narrow(dim, i, 1) for i in range(3))
    b0, b1, b2 = (b.narrow(dim, i, 1) for i in range(3))
    return ember.cat([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], dim=dim)


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """The diagonal of the matrices over (dim1, dim2) (torch.linalg.diagonal's defaults: the last two dims)."""
    return _tensor("diagonal", A).diagonal(offset, dim1, dim2)


def vander(x: Tensor, *, N: int | None = None) -> Tensor:
    """The Vandermonde matrix of x ``(*, n)``: columns x^0, x^1, ..., x^(N-1) (increasing powers, torch's order)."""
    x = _tensor("vander", x, "x")
    if x.ndim < 1:
        raise ShapeError(f"linalg.vander: x must have at least one dimension, got shape {x.shape}")
    n = x.shape[-1] if N is None else int(N)
    if n < 0:
        raise ValueRangeError(f"linalg.vander: N must be non-negative, got {n}")
    if n <= 1:
        return ember.ones((*x.shape, n), dtype=x.dtype, device=x.device)
    ones = ember.ones((*x.shape, 1), dtype=x.dtype, device=x.device)
    return ember.cat([ones, x.unsqueeze(-1).expand(*x.shape, n - 1)], dim=-1).cumprod(-1)


def householder_product(A: Tensor, tau: Tensor) -> Tensor:
    """The first n columns of H_1 ... H_k, H_i = I - tau_i v_i v_i^T with v_i stored below A's diagonal (LAPACK
    orgqr, ungqr for complex; what :func:`qr` builds Q from). Differentiable in A (below its diagonal) and tau."""
    return call(_ops.householder_product, _tensor("householder_product", A), _tensor("householder_product", tau,
                                                                                       "tau"))


def multi_dot(tensors: Sequence[Tensor]) -> Tensor:
    """The product of a chain of matrices in the cheapest order (dynamic programming over the chain); the first
    and last may be 1-D (a row and a column vector), as torch allows."""
    ts = list(tensors)
    if len(ts) < 2:
        raise ShapeError(f"linalg.multi_dot: expected at least 2 tensors but got {len(ts)}")
    for i, t in enumerate(ts):
        _tensor("multi_dot", t, f"tensors[{i}]")
        if not (t.ndim == 2 or (t.ndim == 1 and i in (0, len(ts) - 1))):
            raise ShapeError(f"linalg.multi_dot: tensor {i} must be 2D{' or 1D' if i in (0, len(ts) - 1) else ''} "
                             f"but got {t.ndim}D (shape {t.shape})")
    first_vec, last_vec = ts[0].ndim == 1, ts[-1].ndim == 1
    if first_vec:
        ts[0] = ts[0].unsqueeze(0)
    if last_vec:
        ts[-1] = ts[-1].unsqueeze(-1)
    for i in range(len(ts) - 1):
        if ts[i].shape[1] != ts[i + 1].shape[0]:
            raise ShapeError(f"linalg.multi_dot: tensors {i} and {i + 1} cannot be multiplied "
                             f"({ts[i].shape} and {ts[i + 1].shape})")
    dims = [ts[0].shape[0]] + [t.shape[1] for t in ts]
    k = len(ts)
    cost = [[0] * k for _ in range(k)]
    split = [[0] * k for _ in range(k)]
    for length in range(1, k):
        for i in range(k - length):
            j = i + length
            cost[i][j] = math.inf  # type: ignore[call-overload]
            for s in range(i, j):
                c = cost[i][s] + cost[s + 1][j] + dims[i] * dims[s + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, s

    def product(i: int, j: int) -> Tensor:
        if i == j:
            return ts[i]
        s = split[i][j]
        return product(i, s) @ product(s + 1, j)

    out = product(0, k - 1)
    if first_vec:
        out = out.squeeze(0)
    if last_vec:
        out = out.squeeze(-1)
    return out


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """The dot product of vectors along ``dim`` (inputs broadcast): ``(x * y).sum(dim)`` for real tensors.
    Core's ``ember.linalg.vecdot`` wins when core has one."""
    x, y = _tensor("vecdot", x, "x"), _tensor("vecdot", y, "y")
    shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(y.shape)))
    if not shape or not -len(shape) <= dim < len(shape):
        raise ShapeError(f"linalg.vecdot: dim {dim} out of range for the broadcast shape {shape} of x "
                         f"{tuple(x.shape)} and y {tuple(y.shape)}")
    return (x * y).sum(dim)


def tensorinv(A: Tensor, ind: int = 2) -> Tensor:
    """The inverse of A for :func:`tensordot` over its first ``ind`` dims: ``A.reshape(prod(A.shape[:ind]), -1)``
    must be square; the result has shape ``A.shape[ind:] + A.shape[:ind]``."""
    A = _tensor("tensorinv", A)
    if not isinstance(ind, int) or ind <= 0:
        raise ValueRangeError(f"linalg.tensorinv: Expected a strictly positive integer for 'ind', but got {ind!r}")
    out_shape, in_shape = tuple(A.shape[:ind]), tuple(A.shape[ind:])
    rows, cols = math.prod(out_shape), math.prod(in_shape)
    if rows != cols:
        raise ShapeError(f"linalg.tensorinv: Expected self to satisfy the requirement prod(self.shape[ind:]) == "
                         f"prod(self.shape[:ind]), but got {cols} != {rows} (shape {A.shape}, ind={ind})")
    return inv(A.reshape(rows, cols)).reshape(*in_shape, *out_shape)


def tensorsolve(A: Tensor, B: Tensor, dims: Sequence[int] | None = None) -> Tensor:
    """X with ``tensordot(A, X, X.ndim) == B``; X has shape ``A.shape[B.ndim:]``. ``dims`` moves those dims of A
    to the end first."""
    A, B = _tensor("tensorsolve", A), _tensor("tensorsolve", B, "B")
    if dims is not None:
        dims = [d % A.ndim for d in dims]
        A = A.movedim(tuple(dims), tuple(range(A.ndim - len(dims), A.ndim)))
    x_shape = tuple(A.shape[B.ndim:])
    rows, cols = math.prod(tuple(B.shape)), math.prod(x_shape)
    if tuple(A.shape[:B.ndim]) != tuple(B.shape) or rows != cols:
        raise ShapeError(f"linalg.tensorsolve: Expected A.shape[:B.ndim] == B.shape and prod(A.shape[B.ndim:]) == "
                         f"B.numel(), got A {A.shape} and B {B.shape}")
    return solve(A.reshape(rows, cols), B.reshape(rows)).reshape(*x_shape)
