"""The extension ops of ember-linalg: shape rules, host (LAPACK) functions, and vjps written in ember ops.

Each op takes its tensors positionally and its options as keywords (the host kernel relies on that). The
torch-signature functions users call (vector right-hand sides, ``left=``, error checks that read ``info``) are in
:mod:`ember_linalg.api`; the vjps follow the formulas of PyTorch's ``FunctionsManual.cpp`` (or are derived the same
way where noted), so the gradients match torch's, including where torch is deliberately partial (degenerate
eigenvalues, ``svd``'s gauge).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import scipy.linalg as sla
from scipy.linalg import lapack

import ember
from ember import dtypes as dt
from ember.errors import AutodiffError, ShapeError, UnsupportedError
from ember.extension import TensorSpec

from ._base import (
    LinAlgError,
    batch_index,
    batch_shape,
    call,
    check_float,
    check_matrix,
    check_square,
    host_op,
    is_zero,
    real_dtype,
)

Tensor = ember.Tensor


# ---------------------------------------------------------------------------------------------------------------------
# host helpers
# ---------------------------------------------------------------------------------------------------------------------
def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, *a.shape[-2:])


def _getrf_info(a: np.ndarray) -> np.ndarray:
    """LAPACK getrf's info per matrix of a batch: 0, or the 1-based index of the first zero pivot of U."""
    flat = _flat(a)
    info = np.zeros(flat.shape[0], dtype=np.int32)
    for i, m in enumerate(flat):
        getrf = lapack.get_lapack_funcs("getrf", (m,))
        _, _, info[i] = getrf(m)
    return info.reshape(a.shape[:-2])


def _potrf_info(a: np.ndarray, upper: bool) -> np.ndarray:
    """LAPACK potrf's info per matrix: 0, or the order of the leading minor that is not positive-definite."""
    flat = _flat(a)
    info = np.zeros(flat.shape[0], dtype=np.int32)
    for i, m in enumerate(flat):
        potrf = lapack.get_lapack_funcs("potrf", (m,))
        _, info[i] = potrf(m, lower=not upper, clean=True)
    return info.reshape(a.shape[:-2])


def _first_failure(info: np.ndarray) -> tuple[int, int]:
    flat = info.reshape(-1)
    k = int(np.flatnonzero(flat)[0])
    return k, int(flat[k])


def _same(a: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=like.dtype)


def _spec(shape: tuple[int, ...], dtype: dt.DType) -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


def _real_np(a: np.ndarray) -> np.dtype:
    """The real numpy dtype of ``a``'s precision (singular values, Hermitian eigenvalues, log|det|)."""
    return np.zeros(0, a.dtype).real.dtype


def _t(x: Tensor) -> Tensor:
    """The conjugate transpose of the last two dims (torch's ``mH``; the transpose for real tensors): the vjps below
    are torch's complex formulas, which reduce to the real ones."""
    return x.mT.conj() if x.dtype.is_complex else x.mT


def _realify(g: Tensor, like: Tensor) -> Tensor:
    """A gradient for a real input computed in complex arithmetic keeps its real part (torch's handle_r_to_c)."""
    return ember.real(g) if g.dtype.is_complex and not like.dtype.is_complex else g


def _eye_like(n: int, like: Tensor) -> Tensor:
    return ember.eye(n, dtype=like.dtype, device=like.device)


def _set_diag(m: Tensor, d: Tensor) -> Tensor:
    """m with its diagonal (last two dims) replaced by d."""
    n = m.shape[-1]
    mask = ember.eye(n, dtype=ember.bool, device=m.device)
    return ember.where(mask, ember.diag_embed(d), m)


# ---------------------------------------------------------------------------------------------------------------------
# solve, inv, det, slogdet
# ---------------------------------------------------------------------------------------------------------------------
def _solve_spec(A: TensorSpec, B: TensorSpec) -> TensorSpec:
    check_float("solve", A, B, names=("A", "B"))
    check_square("solve", A)
    check_matrix("solve", B, "B")
    if B.shape[-2] != A.shape[-1]:
        raise ShapeError(f"Incompatible shapes of A and B for the equation AX = B ({A.shape[-2]}x"
                         f"{A.shape[-1]} and {B.shape[-2]}x{B.shape[-1]}; A {A.shape}, B {B.shape})")
    return _spec((*batch_shape("solve", A.shape[:-2], B.shape[:-2]), *B.shape[-2:]), A.dtype)


@host_op("solve", _solve_spec)
def solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """X with A X = B for square A (*, n, n) and B (*, n, k), batch dims broadcast."""
    try:
        return _same(np.linalg.solve(a, b), a)
    except np.linalg.LinAlgError:
        k, _ = _first_failure(_getrf_info(a))
        raise LinAlgError(f"linalg.solve: {batch_index(a.shape, k)}The solver failed because the input matrix is "
                          "singular.") from None


@solve.vjp
def _solve_vjp(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
    A, _ = ctx.inputs
    (X,) = ctx.outputs
    gB = call(solve, _t(A), g)
    return -(gB @ _t(X)), gB


def _square_spec(fn: str) -> Any:
    def spec(A: TensorSpec, **_options: Any) -> TensorSpec:
        check_float(fn, A, names=("A",))
        check_square(fn, A)
        return A

    return spec


@host_op("inv", _square_spec("inv"))
def inv(a: np.ndarray) -> np.ndarray:
    """The inverse of square matrices A (*, n, n); a singular one raises :class:`LinAlgError`."""
    try:
        return _same(np.linalg.inv(a), a)
    except np.linalg.LinAlgError:
        k, i = _first_failure(_getrf_info(a))
        raise LinAlgError(f"linalg.inv: {batch_index(a.shape, k)}The diagonal element {i} is zero, the inversion "
                          "could not be completed because the input matrix is singular.") from None


@inv.vjp
def _inv_vjp(ctx: Any, g: Tensor) -> Tensor:
    Ai = _t(ctx.outputs[0])
    return -(Ai @ g @ Ai)


def _inv_ex_spec(A: TensorSpec) -> tuple[TensorSpec, TensorSpec]:
    _square_spec("inv_ex")(A)
    return A, _spec(A.shape[:-2], dt.int32)


@host_op("inv_ex", _inv_ex_spec)
def inv_ex(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inverse, info): info is 0 where the inversion succeeded, else the 1-based index of U's zero pivot (the
    inverse of those matrices is NaN)."""
    try:
        return _same(np.linalg.inv(a), a), np.zeros(a.shape[:-2], np.int32)
    except np.linalg.LinAlgError:
        info = _getrf_info(a)
        out = np.full(a.shape, np.nan, a.dtype)
        ok = info == 0
        if ok.any():
            out[ok] = np.linalg.inv(a[ok])
        return out, info


@inv_ex.vjp
def _inv_ex_vjp(ctx: Any, g: Tensor, _ginfo: Any) -> Tensor:
    Ai = _t(ctx.outputs[0])
    return -(Ai @ g @ Ai)


def _det_spec(A: TensorSpec) -> TensorSpec:
    _square_spec("det")(A)
    return _spec(A.shape[:-2], A.dtype)


@host_op("det", _det_spec)
def det(a: np.ndarray) -> np.ndarray:
    """The determinants of square matrices A (*, n, n)."""
    return _same(np.linalg.det(a), a)


@det.vjp
def _det_vjp(ctx: Any, g: Tensor) -> Tensor:
    # g * adj(A)^T. Invertible A (every batch element): adj(A)^T = det(A) A^{-T}, from one inverse. Otherwise the
    # adjugate from the SVD, exact at singular matrices too (as torch's):
    #   A = U S Vh  =>  adj(A)^T = det(U) det(Vh) U diag(prod_{j != i} s_j) Vh
    (A,) = ctx.inputs
    (d,) = ctx.outputs
    # complex A: g * conj(adj(A))^T, i.e. g conj(det) A^{-H} (torch's convention); d.conj() is d for real A
    Ai, info = call(inv_ex, A)
    dc = d.conj() if d.dtype.is_complex else d
    if not bool((info != 0).any().item()) and bool((d != 0).all().item()):
        return (g * dc).unsqueeze(-1).unsqueeze(-1) * _t(Ai)
    U, S, Vh = call(svd, A, full_matrices=False)
    n = A.shape[-1]
    others = ember.where(ember.eye(n, dtype=ember.bool, device=A.device), 1, S.unsqueeze(-2).expand(*S.shape, n))
    adj_s = others.prod(-1)
    sign = call(det, U) * call(det, Vh)
    if sign.dtype.is_complex:
        sign = sign.conj()
    return (g * sign).unsqueeze(-1).unsqueeze(-1) * ((U * adj_s.unsqueeze(-2)) @ Vh)


def _slogdet_spec(A: TensorSpec) -> tuple[TensorSpec, TensorSpec]:
    _square_spec("slogdet")(A)
    return _spec(A.shape[:-2], A.dtype), _spec(A.shape[:-2], real_dtype(A.dtype))


@host_op("slogdet", _slogdet_spec)
def slogdet(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sign, log|det|) of square matrices A (*, n, n); a singular matrix gives (0, -inf). For complex A the sign
    is det/|det| (complex) and log|det| real."""
    sign, logabs = np.linalg.slogdet(a)
    return _same(sign, a), np.asarray(logabs, dtype=_real_np(a))


@slogdet.vjp
def _slogdet_vjp(ctx: Any, gsign: Any, glog: Tensor) -> Tensor:
    # gA = c A^{-H}: c = g_logabsdet for real A; for complex A, d sign = sign * i Im tr(A^{-1} dA) adds
    # i Im(g_sign conj(sign)) (torch's slogdet_backward)
    (A,) = ctx.inputs
    Ai, _ = call(inv_ex, A)
    c = glog
    if A.dtype.is_complex and not is_zero(gsign):
        sign = ctx.outputs[0]
        c = ember.complex(glog, ember.imag(gsign * sign.conj()))
    return c.unsqueeze(-1).unsqueeze(-1) * _t(Ai)


# ---------------------------------------------------------------------------------------------------------------------
# cholesky, solve_triangular
# ---------------------------------------------------------------------------------------------------------------------
@host_op("cholesky", _square_spec("cholesky"))
def cholesky(a: np.ndarray, *, upper: bool = False) -> np.ndarray:
    """The Cholesky factor of symmetric positive-definite A (lower L with A = L L^T, or upper U with A = U^T U)."""
    try:
        return _same(np.linalg.cholesky(a, upper=upper), a)
    except np.linalg.LinAlgError:
        k, i = _first_failure(_potrf_info(a, upper))
        raise LinAlgError(f"linalg.cholesky: {batch_index(a.shape, k)}The factorization could not be completed "
                          f"because the input is not positive-definite (the leading minor of order {i} is not "
                          "positive-definite).") from None


def _cholesky_grad(L: Tensor, gL: Tensor, upper: bool) -> Tensor:
    # torch's cholesky_backward: gA = L^{-H} Φ(L^H gL) L^{-1}, Φ taking the lower triangle with half its diagonal,
    # symmetrised
    if upper:
        L, gL = _t(L), _t(gL)
    gA = (_t(L) @ gL).tril()
    gA = 0.5 * (gA + _t(gA.tril(-1)))
    gA = call(solve_triangular, _t(L), gA, upper=True, left=True, unitriangular=False)
    return call(solve_triangular, L, gA, upper=False, left=False, unitriangular=False)


@cholesky.vjp
def _cholesky_vjp(ctx: Any, g: Tensor) -> Tensor:
    return _cholesky_grad(ctx.outputs[0], g, ctx.kwargs.get("upper", False))


def _cholesky_ex_spec(A: TensorSpec, *, upper: bool = False) -> tuple[TensorSpec, TensorSpec]:
    _square_spec("cholesky_ex")(A)
    return A, _spec(A.shape[:-2], dt.int32)


@host_op("cholesky_ex", _cholesky_ex_spec)
def cholesky_ex(a: np.ndarray, *, upper: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(L, info): info is 0 where the factorization succeeded, else the order of the first leading minor that is
    not positive-definite (L is then LAPACK's partial factor)."""
    try:
        return _same(np.linalg.cholesky(a, upper=upper), a), np.zeros(a.shape[:-2], np.int32)
    except np.linalg.LinAlgError:
        flat = _flat(a)
        out = np.empty_like(flat)
        info = np.zeros(flat.shape[0], np.int32)
        for i, m in enumerate(flat):
            potrf = lapack.get_lapack_funcs("potrf", (m,))
            out[i], info[i] = potrf(m, lower=not upper, clean=True)
        return out.reshape(a.shape), info.reshape(a.shape[:-2])


@cholesky_ex.vjp
def _cholesky_ex_vjp(ctx: Any, g: Tensor, _ginfo: Any) -> Tensor:
    return _cholesky_grad(ctx.outputs[0], g, ctx.kwargs.get("upper", False))


def _tri_spec(A: TensorSpec, B: TensorSpec, *, upper: bool, left: bool = True,
              unitriangular: bool = False) -> TensorSpec:
    check_float("solve_triangular", A, B, names=("A", "B"))
    check_square("solve_triangular", A)
    check_matrix("solve_triangular", B, "B")
    n = B.shape[-2] if left else B.shape[-1]
    if n != A.shape[-1]:
        eq = "AX = B" if left else "XA = B"
        raise ShapeError(f"Incompatible shapes of A and B for the equation {eq} "
                         f"(A {A.shape}, B {B.shape})")
    return _spec((*batch_shape("solve_triangular", A.shape[:-2], B.shape[:-2]), *B.shape[-2:]), A.dtype)


def _substitute(a: np.ndarray, b: np.ndarray, lower: bool, unit: bool) -> np.ndarray:
    """Forward/back substitution over the batch (what trsm computes): infinities and NaNs for a zero diagonal,
    as torch gives, where LAPACK's trtrs refuses."""
    n = a.shape[-1]
    x = np.zeros(b.shape, dtype=b.dtype)
    order = range(n) if lower else range(n - 1, -1, -1)
    with np.errstate(all="ignore"):
        for i in order:
            rest = slice(0, i) if lower else slice(i + 1, n)
            acc = b[..., i, :] - np.einsum("...j,...jk->...k", a[..., i, rest], x[..., rest, :])
            x[..., i, :] = acc if unit else acc / a[..., i, i][..., None]
    return x


@host_op("solve_triangular", _tri_spec)
def solve_triangular(a: np.ndarray, b: np.ndarray, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> np.ndarray:
    """X with A X = B (``left``) or X A = B for triangular A; only A's ``upper``/lower triangle is read."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, (*batch, *a.shape[-2:]))
    b = np.broadcast_to(b, (*batch, *b.shape[-2:]))
    lower = not upper
    if not left:  # X A = B  <=>  A^T X^T = B^T, and A^T's triangle is the other one
        a, b, lower = np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2), not lower
    try:
        x = sla.solve_triangular(a, b, lower=lower, unit_diagonal=unitriangular, check_finite=False)
    except np.linalg.LinAlgError:  # a zero on the diagonal: trtrs refuses, torch (trsm) returns inf/nan
        tri = np.tril(a) if lower else np.triu(a)
        x = _substitute(tri, np.asarray(b), lower, unitriangular)
    x = _same(x, a)
    return np.swapaxes(x, -1, -2) if not left else x


@solve_triangular.vjp
def _solve_triangular_vjp(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
    A, _ = ctx.inputs
    (X,) = ctx.outputs
    upper, left = ctx.kwargs["upper"], ctx.kwargs.get("left", True)
    unit = ctx.kwargs.get("unitriangular", False)
    gB = call(solve_triangular, _t(A), g, upper=not upper, left=left, unitriangular=unit)
    gA = -(gB @ _t(X)) if left else -(_t(X) @ gB)
    if upper:
        gA = gA.triu(1) if unit else gA.triu()
    else:
        gA = gA.tril(-1) if unit else gA.tril()
    return gA, gB


# ---------------------------------------------------------------------------------------------------------------------
# eigh, eigvalsh, svd, svdvals
# ---------------------------------------------------------------------------------------------------------------------
def _check_uplo(fn: str, UPLO: str) -> None:
    if UPLO not in ("L", "U"):
        raise ShapeError(f"UPLO must be 'L' or 'U', got {UPLO!r}")


def _eigh_spec(A: TensorSpec, *, UPLO: str = "L") -> tuple[TensorSpec, TensorSpec]:
    check_float("eigh", A, names=("A",))
    check_square("eigh", A)
    _check_uplo("eigh", UPLO)
    return _spec(A.shape[:-1], real_dtype(A.dtype)), A


@host_op("eigh", _eigh_spec)
def eigh(a: np.ndarray, *, UPLO: str = "L") -> tuple[np.ndarray, np.ndarray]:
    """(eigenvalues ascending, eigenvectors as columns) of symmetric A, reading its ``UPLO`` triangle."""
    w, v = np.linalg.eigh(a, UPLO=UPLO)
    return np.asarray(w, dtype=_real_np(a)), _same(v, a)


def _eigh_grad(L: Tensor, V: Tensor, gL: Tensor | None, gV: Tensor | None) -> Tensor:
    # torch's linalg_eig_backward (hermitian case). With eigenvector gradients the off-diagonal terms divide by
    # L_j - L_i: repeated eigenvalues give inf/nan, as torch documents; eigenvalue gradients alone stay finite.
    if is_zero(gV):
        d = gL if gL is not None else ember.zeros(L.shape, dtype=L.dtype, device=L.device)
        return (V * d.unsqueeze(-2)) @ _t(V)
    VhgV = _t(V) @ gV
    VhgV = 0.5 * (VhgV - _t(VhgV))
    E = L.unsqueeze(-2) - L.unsqueeze(-1)
    inner = VhgV / E
    d = gL if gL is not None else ember.zeros(L.shape, dtype=L.dtype, device=L.device)
    inner = _set_diag(inner, d)
    return V @ inner @ _t(V)


@eigh.vjp
def _eigh_vjp(ctx: Any, gL: Tensor, gV: Tensor) -> Tensor:
    L, V = ctx.outputs
    return _eigh_grad(L, V, gL, gV)


def _eigvalsh_spec(A: TensorSpec, *, UPLO: str = "L") -> TensorSpec:
    check_float("eigvalsh", A, names=("A",))
    check_square("eigvalsh", A)
    _check_uplo("eigvalsh", UPLO)
    return _spec(A.shape[:-1], real_dtype(A.dtype))


@host_op("eigvalsh", _eigvalsh_spec)
def eigvalsh(a: np.ndarray, *, UPLO: str = "L") -> np.ndarray:
    """The eigenvalues (ascending) of symmetric A, reading its ``UPLO`` triangle."""
    return np.asarray(np.linalg.eigvalsh(a, UPLO=UPLO), dtype=_real_np(a))


@eigvalsh.vjp
def _eigvalsh_vjp(ctx: Any, g: Tensor) -> Tensor:
    (A,) = ctx.inputs
    L, V = call(eigh, A, UPLO=ctx.kwargs.get("UPLO", "L"))
    return _eigh_grad(L, V, g, None)


def _svd_spec(A: TensorSpec, *, full_matrices: bool = True) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    check_float("svd", A, names=("A",))
    check_matrix("svd", A)
    *b, m, n = A.shape
    k = min(m, n)
    u, v = (m, n) if full_matrices else (k, k)
    return _spec((*b, m, u), A.dtype), _spec((*b, k), real_dtype(A.dtype)), _spec((*b, v, n), A.dtype)


@host_op("svd", _svd_spec)
def svd(a: np.ndarray, *, full_matrices: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(U, S, Vh) with A = U diag(S) Vh, singular values descending (LAPACK gesdd, as torch on CPU)."""
    u, s, vh = np.linalg.svd(a, full_matrices=full_matrices)
    return _same(u, a), np.asarray(s, dtype=_real_np(a)), _same(vh, a)


def _gauge_warning(S: Tensor) -> None:
    s = S.detach().numpy()
    if s.shape[-1] < 2:
        return
    gaps = np.abs(np.diff(s, axis=-1))
    if (gaps <= 10 * np.finfo(s.dtype).eps * np.maximum(np.abs(s[..., :1]), 1)).any():
        warnings.warn("linalg.svd: the loss depends on the singular vectors U or Vh of a matrix with repeated "
                      "singular values; those vectors are only defined up to a rotation within each repeated "
                      "subspace (the gauge), so the gradient is not defined (inf/nan). Use singular values only "
                      "(linalg.svdvals) or a gauge-invariant function of U and Vh.", UserWarning, stacklevel=2)


def _svd_grad(U: Tensor, S: Tensor, Vh: Tensor, gU: Tensor | None, gS: Tensor | None, gVh: Tensor | None) -> Tensor:
    # torch's svd_backward; U, Vh are the reduced factors. Complex A adds i Im(diag(U^H gU)) / S on the diagonal
    # (the phase of the singular vectors)
    m, n = U.shape[-2], Vh.shape[-1]
    has_u, has_v = not is_zero(gU), not is_zero(gVh)
    if not has_u and not has_v:
        gS_ = gS if gS is not None else ember.zeros(S.shape, dtype=S.dtype, device=S.device)
        return U @ (gS_.unsqueeze(-1) * Vh) if m >= n else (U * gS_.unsqueeze(-2)) @ Vh
    _gauge_warning(S)
    UhgU = (_t(U) @ gU) - _t(_t(U) @ gU) if has_u else None
    VhgV = (Vh @ _t(gVh)) - _t(Vh @ _t(gVh)) if has_v else None
    S2 = S * S
    E = _set_diag(S2.unsqueeze(-2) - S2.unsqueeze(-1), ember.ones(S.shape, dtype=S.dtype, device=S.device))
    if has_u and has_v:
        gA = (UhgU * S.unsqueeze(-2) + S.unsqueeze(-1) * VhgV) / E
    elif has_u:
        gA = UhgU * (S.unsqueeze(-2) / E)
    else:
        gA = S.unsqueeze(-1) * (VhgV / E)
    if gS is not None:
        gA = gA + ember.diag_embed(gS)
    if U.dtype.is_complex and has_u:
        gA = gA + ember.diag_embed(UhgU.diagonal(0, -2, -1) / (2 * S))
    if m > n and has_u:
        gA = U @ gA
        gUSinv = gU / S.unsqueeze(-2)
        gA = gA + gUSinv - U @ (_t(U) @ gUSinv)
        return gA @ Vh
    if m < n and has_v:
        gA = gA @ Vh
        SinvgVh = gVh / S.unsqueeze(-1)
        gA = gA + SinvgVh - (SinvgVh @ _t(Vh)) @ Vh
        return U @ gA
    return U @ (gA @ Vh) if m >= n else (U @ gA) @ Vh


@svd.vjp
def _svd_vjp(ctx: Any, gU: Tensor, gS: Tensor, gVh: Tensor) -> Tensor:
    U, S, Vh = ctx.outputs
    if ctx.kwargs.get("full_matrices", True):  # torch narrows the full factors to the reduced ones
        k = S.shape[-1]
        U, gU = U[..., :, :k], gU[..., :, :k]
        Vh, gVh = Vh[..., :k, :], gVh[..., :k, :]
    return _svd_grad(U, S, Vh, gU, gS, gVh)


def _svdvals_spec(A: TensorSpec) -> TensorSpec:
    check_float("svdvals", A, names=("A",))
    check_matrix("svdvals", A)
    return _spec((*A.shape[:-2], min(A.shape[-2:])), real_dtype(A.dtype))


@host_op("svdvals", _svdvals_spec)
def svdvals(a: np.ndarray) -> np.ndarray:
    """The singular values of A, descending."""
    return np.asarray(np.linalg.svd(a, compute_uv=False), dtype=_real_np(a))


@svdvals.vjp
def _svdvals_vjp(ctx: Any, g: Tensor) -> Tensor:
    (A,) = ctx.inputs
    U, S, Vh = call(svd, A, full_matrices=False)
    return _svd_grad(U, S, Vh, None, g, None)


# ---------------------------------------------------------------------------------------------------------------------
# qr
# ---------------------------------------------------------------------------------------------------------------------
def _qr_spec(A: TensorSpec, *, mode: str = "reduced") -> tuple[TensorSpec, TensorSpec]:
    check_float("qr", A, names=("A",))
    check_matrix("qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise ShapeError(f"qr received unrecognized mode {mode!r} but expected one of 'reduced' "
                         "(default), 'r', or 'complete'")
    *b, m, n = A.shape
    k = min(m, n)
    if mode == "complete":
        return _spec((*b, m, m), A.dtype), _spec((*b, m, n), A.dtype)
    r = _spec((*b, k, n), A.dtype)
    return (_spec((0,), A.dtype), r) if mode == "r" else (_spec((*b, m, k), A.dtype), r)


@host_op("qr", _qr_spec)
def qr(a: np.ndarray, *, mode: str = "reduced") -> tuple[np.ndarray, np.ndarray]:
    """(Q, R) with A = Q R (LAPACK geqrf/orgqr, as torch); ``mode='r'`` gives an empty Q."""
    if mode == "r":
        return np.empty((0,), a.dtype), _same(np.linalg.qr(a, mode="r"), a)
    q, r = np.linalg.qr(a, mode=mode)
    return _same(q, a), _same(r, a)


def _copyltu(M: Tensor) -> Tensor:
    """The Hermitian matrix whose strict lower triangle is M's and whose diagonal is Re(diag M):
    tril(M, -1) + tril(M, -1)^H + diag(Re M) (torch's; tril(M) + tril(M, -1)^T for real M)."""
    if not M.dtype.is_complex:
        return M.tril() + _t(M.tril(-1))
    low = M.tril(-1)
    return low + _t(low) + ember.diag_embed(ember.real(M.diagonal(0, -2, -1))).to(M.dtype)


def _qr_square_grad(Q: Tensor, R: Tensor, gQ: Tensor, gR: Tensor) -> Tensor:
    # m >= n, reduced factors: M = R gR^T - gQ^T Q,  gA = (gQ + Q copyltu(M)) R^{-T}
    M = R @ _t(gR) - _t(gQ) @ Q
    rhs = gQ + Q @ _copyltu(M)
    return call(solve_triangular, _t(R), rhs, upper=False, left=False, unitriangular=False)


@qr.vjp
def _qr_vjp(ctx: Any, gQ: Tensor, gR: Tensor) -> Tensor:
    (A,) = ctx.inputs
    mode = ctx.kwargs.get("mode", "reduced")
    Q, R = ctx.outputs
    if mode == "r":
        raise UnsupportedError("linalg.qr: The derivative of linalg.qr depends on Q, which is not computed when "
                               "mode='r'. Use linalg.qr(A, mode='reduced') to differentiate through linalg.qr.")
    m, n = A.shape[-2:]
    if mode == "complete" and m > n:
        raise UnsupportedError(f"linalg.qr: The QR decomposition is not differentiable when mode='complete' and "
                               f"nrows > ncols (A {A.shape}).")
    if m >= n:
        return _qr_square_grad(Q, R, gQ, gR)
    # wide: A = [X | Y] with X = Q U (square), Y = Q V:  gX from the square rule with gQ + Y gV^T, gY = Q gV
    Y = A[..., :, m:]
    U, gU, gV = R[..., :, :m], gR[..., :, :m], gR[..., :, m:]
    gX = _qr_square_grad(Q, U, gQ + Y @ _t(gV), gU)
    return ember.cat([gX, Q @ gV], dim=-1)


# ---------------------------------------------------------------------------------------------------------------------
# pinv, matrix_rank, lstsq
# ---------------------------------------------------------------------------------------------------------------------
def _tolerance(s_max: np.ndarray, atol: float | None, rtol: float | None, m: int, n: int,
               dtype: np.dtype) -> np.ndarray:
    """torch's rule: max(atol, rtol * s_max); rtol defaults to eps * max(m, n) when atol is not given, else 0."""
    if rtol is None:
        rtol = float(np.finfo(dtype).eps) * max(m, n) if atol is None or atol <= 0 else 0.0
    return np.maximum(atol or 0.0, rtol * s_max)


def _pinv_spec(A: TensorSpec, *, atol: float | None = None, rtol: float | None = None,
               hermitian: bool = False) -> TensorSpec:
    check_float("pinv", A, names=("A",))
    check_matrix("pinv", A)
    if hermitian:
        check_square("pinv", A)
    return _spec((*A.shape[:-2], A.shape[-1], A.shape[-2]), A.dtype)


@host_op("pinv", _pinv_spec)
def pinv(a: np.ndarray, *, atol: float | None = None, rtol: float | None = None,
         hermitian: bool = False) -> np.ndarray:
    """The Moore-Penrose pseudo-inverse (SVD, or eigh when ``hermitian``), singular values at or below
    max(atol, rtol * s_max) treated as zero."""
    m, n = a.shape[-2:]
    if a.size == 0:
        return np.zeros((*a.shape[:-2], n, m), a.dtype)
    if hermitian:
        w, v = np.linalg.eigh(a)
        s = np.abs(w)
        tol = _tolerance(s.max(-1, keepdims=True), atol, rtol, m, n, a.dtype)
        with np.errstate(divide="ignore"):
            winv = np.where(s > tol, 1 / np.where(s > tol, w, 1), 0)
        return _same((v * winv[..., None, :]) @ np.swapaxes(v, -1, -2).conj(), a)
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    tol = _tolerance(s[..., :1], atol, rtol, m, n, a.dtype)
    sinv = np.where(s > tol, 1 / np.where(s > tol, s, 1), 0)
    return _same(np.swapaxes(vh, -1, -2).conj() @ (sinv[..., :, None] * np.swapaxes(u, -1, -2).conj()), a)


def pinv_backward(g: Tensor, pinvA: Tensor, A: Tensor) -> Tensor:
    """torch's pinv_backward: the gradient of A from that of pinv(A) (constant rank)."""
    m, n = A.shape[-2:]
    pinvAh, gh = _t(pinvA), _t(g)
    if m <= n:
        K = gh @ pinvA
        KpinvAh = K @ pinvAh
        return -_t(pinvA @ K) + KpinvAh - (A @ pinvA) @ KpinvAh + (pinvAh @ pinvA) @ (gh - K @ A)
    K = pinvA @ gh
    pinvAhK = pinvAh @ K
    return -_t(K @ pinvA) + (gh - A @ K) @ pinvA @ pinvAh + pinvAhK - (pinvAhK @ pinvA) @ A


@pinv.vjp
def _pinv_vjp(ctx: Any, g: Tensor) -> Tensor:
    return pinv_backward(g, ctx.outputs[0], ctx.inputs[0])


def _rank_spec(A: TensorSpec, *, atol: float | None = None, rtol: float | None = None,
               hermitian: bool = False) -> TensorSpec:
    check_float("matrix_rank", A, names=("A",))
    check_matrix("matrix_rank", A)
    if hermitian:
        check_square("matrix_rank", A)
    return _spec(A.shape[:-2], dt.int64)


@host_op("matrix_rank", _rank_spec, differentiable=False)
def matrix_rank(a: np.ndarray, *, atol: float | None = None, rtol: float | None = None,
                hermitian: bool = False) -> np.ndarray:
    """The numerical rank: the count of singular values above max(atol, rtol * s_max)."""
    m, n = a.shape[-2:]
    if a.size == 0:
        return np.zeros(a.shape[:-2], np.int64)
    s = np.abs(np.linalg.eigvalsh(a)) if hermitian else np.linalg.svd(a, compute_uv=False)
    tol = _tolerance(s.max(-1, keepdims=True), atol, rtol, m, n, a.dtype)
    return (s > tol).sum(-1).astype(np.int64)


_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq_spec(A: TensorSpec, B: TensorSpec, *, rcond: float | None = None,
                driver: str | None = None) -> tuple[TensorSpec, ...]:
    check_float("lstsq", A, B, names=("A", "B"))
    check_matrix("lstsq", A)
    check_matrix("lstsq", B, "B")
    drv = driver or "gelsy"
    if drv not in _DRIVERS:
        raise ShapeError(f"parameter `driver` should be one of {_DRIVERS}, got {driver!r}")
    *_, m, n = A.shape
    if B.shape[-2] != m:
        raise ShapeError(f"A and B must have the same number of rows (A {A.shape}, B {B.shape})")
    batch = batch_shape("lstsq", A.shape[:-2], B.shape[:-2])
    k = B.shape[-1]
    res = (*batch, k) if m > n and drv != "gelsy" else (0,)
    rank = batch if drv != "gels" else (0,)
    sv = (*batch, min(m, n)) if drv in ("gelsd", "gelss") else (0,)
    real = real_dtype(A.dtype)
    return (_spec((*batch, n, k), A.dtype), _spec(res, real), _spec(rank, dt.int64), _spec(sv, real))


@host_op("lstsq", _lstsq_spec)
def lstsq(a: np.ndarray, b: np.ndarray, *, rcond: float | None = None,
          driver: str | None = None) -> tuple[np.ndarray, ...]:
    """(solution, residuals, rank, singular_values) of min ||A X - B||_F, per torch's driver rules."""
    drv = driver or "gelsy"
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, n = a.shape[-2:]
    k = b.shape[-1]
    fa = np.broadcast_to(a, (*batch, m, n)).reshape(-1, m, n)
    fb = np.broadcast_to(b, (*batch, m, k)).reshape(-1, m, k)
    cond = rcond if rcond is not None else float(np.finfo(a.dtype).eps) * max(m, n)
    count = fa.shape[0]
    x = np.zeros((count, n, k), a.dtype)
    ranks = np.zeros(count, np.int64)
    svs = np.zeros((count, min(m, n)), _real_np(a))
    for i in range(count):
        # gels (QR, assumes full rank) has no scipy driver: gelsy gives the same solution for full-rank A
        sol, _, rank, sv = sla.lstsq(fa[i], fb[i], cond=cond, lapack_driver="gelsy" if drv == "gels" else drv,
                                     check_finite=False)
        x[i], ranks[i] = sol, rank
        if sv is not None and drv in ("gelsd", "gelss"):
            svs[i] = sv
    x = x.reshape(*batch, n, k)
    if m > n and drv != "gelsy":
        res = (np.abs(np.broadcast_to(a, (*batch, m, n)) @ x - np.broadcast_to(b, (*batch, m, k))) ** 2).sum(-2)
    else:
        res = np.empty((0,), a.dtype)
    rank_out = ranks.reshape(batch) if drv != "gels" else np.empty((0,), np.int64)
    sv_out = svs.reshape(*batch, min(m, n)) if drv in ("gelsd", "gelss") else np.empty((0,), _real_np(a))
    return x, np.asarray(res.real, dtype=_real_np(a)), rank_out, sv_out


@lstsq.vjp(outputs=(0, 1))
def _lstsq_vjp(ctx: Any, gX: Tensor, gres: Tensor, *_rest: Any) -> tuple[Tensor, Tensor]:
    # torch's linalg_lstsq_backward: X = pinv(A) B; the residuals ||A X - B||^2 (per column) are differentiable too:
    # X is their minimiser, so only their explicit dependence on A and B counts
    A, B = ctx.inputs
    X = ctx.outputs[0]
    pinvA = call(pinv, A)
    gA = pinv_backward(gX @ _t(B), pinvA, A)
    gB = _t(pinvA) @ gX
    if not is_zero(gres) and gres.ndim > 0 and gres.shape[-1] == B.shape[-1]:
        R = (A @ X - B) * (2 * gres.unsqueeze(-2))  # d|r|^2 = 2 Re(conj(r) dr)
        gA = gA + R @ _t(X)
        gB = gB - R
    return gA, gB


# ---------------------------------------------------------------------------------------------------------------------
# LU: lu_factor_ex, the permutation of its pivots, lu_solve
# ---------------------------------------------------------------------------------------------------------------------
def _lu_factor_spec(A: TensorSpec, *, pivot: bool = True) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    check_float("lu_factor", A, names=("A",))
    check_matrix("lu_factor", A)
    if not pivot:
        raise UnsupportedError("LU without pivoting is not implemented on the CPU (LAPACK's "
                               "getrf always pivots), as in torch; use pivot=True")
    *b, m, n = A.shape
    return A, _spec((*b, min(m, n)), dt.int32), _spec(tuple(b), dt.int32)


@host_op("lu_factor_ex", _lu_factor_spec)
def lu_factor_ex(a: np.ndarray, *, pivot: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(LU, pivots, info) of LAPACK getrf: L (unit diagonal, strictly below) and U packed in one matrix, 1-based
    row interchanges, and info (0, or the 1-based index of U's first zero diagonal element)."""
    m, n = a.shape[-2:]
    k = min(m, n)
    if a.size == 0:
        return a.copy(), np.zeros((*a.shape[:-2], k), np.int32), np.zeros(a.shape[:-2], np.int32)
    with warnings.catch_warnings():  # a zero pivot is reported through info, as getrf does
        warnings.simplefilter("ignore", sla.LinAlgWarning)
        lu, piv = sla.lu_factor(a, check_finite=False)
    diag = np.diagonal(lu, axis1=-2, axis2=-1)[..., :k]
    zero = diag == 0
    info = np.where(zero.any(-1), zero.argmax(-1) + 1, 0).astype(np.int32)
    return _same(lu, a), (piv + 1).astype(np.int32), info


def _lu_grad(P: Tensor, L: Tensor, U: Tensor, gL: Tensor, gU: Tensor) -> Tensor:
    """torch's linalg_lu_backward for A = P L U (L unit lower m x k, U upper k x n), derived per shape."""
    m, n = L.shape[-2], U.shape[-1]

    def lsolve_h(Lsq: Tensor, X: Tensor) -> Tensor:  # Lsq^{-H} X, Lsq unit lower
        return call(solve_triangular, _t(Lsq), X, upper=True, left=True, unitriangular=True)

    def usolve_h(Usq: Tensor, X: Tensor) -> Tensor:  # X Usq^{-H}, Usq upper
        return call(solve_triangular, _t(Usq), X, upper=False, left=False, unitriangular=False)

    if m == n:
        M = (_t(L) @ gL).tril(-1) + (gU @ _t(U)).triu()
        return P @ usolve_h(U, lsolve_h(L, M))
    if m < n:  # wide: U = [U1 | U2]
        U1, U2, gU1, gU2 = U[..., :, :m], U[..., :, m:], gU[..., :, :m], gU[..., :, m:]
        M = (_t(L) @ gL - gU2 @ _t(U2)).tril(-1) + (gU1 @ _t(U1)).triu()
        return P @ lsolve_h(L, ember.cat([usolve_h(U1, M), gU2], dim=-1))
    # tall: L = [L1; L2]
    L1, L2, gL1, gL2 = L[..., :n, :], L[..., n:, :], gL[..., :n, :], gL[..., n:, :]
    M = (_t(L1) @ gL1).tril(-1) + (gU @ _t(U) - _t(L2) @ gL2).triu()
    top = usolve_h(U, lsolve_h(L1, M))
    return P @ ember.cat([top, usolve_h(U, gL2)], dim=-2)


def unpack(LU: Tensor, pivots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(P, L, U) from a packed LU factorization (``torch.lu_unpack``); L and U are differentiable in LU."""
    m, n = LU.shape[-2:]
    k = min(m, n)
    L = LU[..., :, :k].tril(-1) + ember.eye(m, k, dtype=LU.dtype, device=LU.device)
    U = LU[..., :k, :].triu()
    P = call(permutation, LU, pivots)
    return P, L, U


@lu_factor_ex.vjp(outputs=(0, 1))
def _lu_factor_vjp(ctx: Any, gLU: Tensor, *_rest: Any) -> Tensor:
    LU, piv = ctx.outputs[0], ctx.outputs[1]
    P, L, U = unpack(LU, piv)
    m, n = LU.shape[-2:]
    k = min(m, n)
    return _lu_grad(P, L, U, gLU[..., :, :k].tril(-1), gLU[..., :k, :].triu())


def _perm_spec(LU: TensorSpec, pivots: TensorSpec) -> TensorSpec:
    m = LU.shape[-2]
    return _spec((*LU.shape[:-2], m, m), LU.dtype)


@host_op("lu_permutation", _perm_spec, differentiable=False)
def permutation(lu: np.ndarray, pivots: np.ndarray) -> np.ndarray:
    """The permutation matrix P of getrf's 1-based pivots (A = P L U), in LU's dtype."""
    m = lu.shape[-2]
    batch = pivots.shape[:-1]
    flat = pivots.reshape(-1, pivots.shape[-1]).astype(np.int64) - 1
    perm = np.tile(np.arange(m), (flat.shape[0], 1))
    rows = np.arange(flat.shape[0])
    for i in range(flat.shape[1]):  # apply the interchanges in order (row i <-> row piv[i])
        j = flat[:, i]
        a, b = perm[rows, i].copy(), perm[rows, j].copy()
        perm[rows, i], perm[rows, j] = b, a
    P = np.zeros((flat.shape[0], m, m), lu.dtype)
    P[rows[:, None], perm, np.arange(m)[None, :]] = 1
    return P.reshape(*batch, m, m)


def _lu_solve_spec(LU: TensorSpec, pivots: TensorSpec, B: TensorSpec, *, left: bool = True,
                   adjoint: bool = False) -> TensorSpec:
    check_float("lu_solve", LU, B, names=("LU", "B"))
    check_square("lu_solve", LU, "LU")
    check_matrix("lu_solve", B, "B")
    if pivots.dtype is not dt.int32 or pivots.shape != LU.shape[:-1]:
        raise ShapeError(f"pivots must be int32 of shape LU.shape[:-1] = {LU.shape[:-1]}, got "
                         f"{pivots.shape} {pivots.dtype.name}")
    n = B.shape[-2] if left else B.shape[-1]
    if n != LU.shape[-1]:
        raise ShapeError(f"Incompatible shapes of A and B for the equation "
                         f"{'AX = B' if left else 'XA = B'} (LU {LU.shape}, B {B.shape})")
    return _spec((*batch_shape("lu_solve", LU.shape[:-2], B.shape[:-2], names=("LU", "B")), *B.shape[-2:]),
                 LU.dtype)


@host_op("lu_solve", _lu_solve_spec)
def lu_solve(lu: np.ndarray, pivots: np.ndarray, b: np.ndarray, *, left: bool = True,
             adjoint: bool = False) -> np.ndarray:
    """X with op(A) X = B (``left``) or X op(A) = B, from A's packed LU and pivots; op(A) = A^H when ``adjoint``."""
    batch = np.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    n = lu.shape[-1]
    flu = np.broadcast_to(lu, (*batch, n, n)).reshape(-1, n, n)
    fpiv = np.broadcast_to(pivots, (*batch, n)).reshape(-1, n).astype(np.int32) - 1
    fb = np.broadcast_to(b, (*batch, *b.shape[-2:])).reshape(-1, *b.shape[-2:])
    # getrs's trans: 0 A, 1 A^T, 2 A^H. X op(A) = B  <=>  op(A)^T X^T = B^T; op(A)^T is A^T, or conj(A) for the
    # adjoint, solved as conj(A^{-1} conj(B^T))
    conj = False
    if not left:
        fb = np.swapaxes(fb, -1, -2)
        if adjoint and np.iscomplexobj(lu):
            fb, conj, trans = fb.conj(), True, 0
        else:
            trans = 0 if adjoint else 1
    else:
        trans = (2 if np.iscomplexobj(lu) else 1) if adjoint else 0
    out = np.stack([sla.lu_solve((flu[i], fpiv[i]), fb[i], trans=trans, check_finite=False)
                    for i in range(flu.shape[0])]) if flu.shape[0] else np.zeros(fb.shape, lu.dtype)
    if conj:
        out = out.conj()
    if not left:
        out = np.swapaxes(out, -1, -2)
    return _same(out, lu).reshape(*batch, *b.shape[-2:])


@lu_solve.vjp
def _lu_solve_vjp(ctx: Any, gX: Tensor) -> tuple[Tensor, None, Tensor]:
    # A = P L U is a function of LU: the gradient of A for the system (as solve's), then through A = P L U
    LU, piv, _ = ctx.inputs
    (X,) = ctx.outputs
    left, adjoint = ctx.kwargs.get("left", True), ctx.kwargs.get("adjoint", False)
    gB = call(lu_solve, LU, piv, gX, left=left, adjoint=not adjoint)
    if left:
        gA = -(gB @ _t(X)) if not adjoint else -(X @ _t(gB))
    else:
        gA = -(_t(X) @ gB) if not adjoint else -(_t(gB) @ X)
    P, L, U = unpack(LU, piv)
    PtgA = _t(P) @ gA
    gLU = (PtgA @ _t(U)).tril(-1) + (_t(L) @ PtgA).triu()
    return gLU, None, gB


# ---------------------------------------------------------------------------------------------------------------------
# matrix_exp, householder_product
# ---------------------------------------------------------------------------------------------------------------------
@host_op("matrix_exp", _square_spec("matrix_exp"))
def matrix_exp(a: np.ndarray) -> np.ndarray:
    """The matrix exponential (scipy's scaling-and-squaring Padé approximation)."""
    if a.size == 0:
        return a.copy()
    return _same(sla.expm(a), a)


@matrix_exp.vjp
def _matrix_exp_vjp(ctx: Any, g: Tensor) -> Tensor:
    # torch's backward_analytic_function_of_a_matrix: exp([[A^T, G], [0, A^T]]) holds the gradient top right
    (A,) = ctx.inputs
    n = A.shape[-1]
    At = _t(A)
    top = ember.cat([At, g], dim=-1)
    bottom = ember.cat([ember.zeros(A.shape, dtype=A.dtype, device=A.device), At], dim=-1)
    big = call(matrix_exp, ember.cat([top, bottom], dim=-2))
    return big[..., :n, n:]


def _householder_spec(A: TensorSpec, tau: TensorSpec) -> TensorSpec:
    check_float("householder_product", A, tau, names=("A", "tau"))
    check_matrix("householder_product", A)
    m, n = A.shape[-2:]
    if n > m:
        raise ShapeError(f"A.size(-2) must be greater than or equal to A.size(-1) "
                         f"(A {A.shape})")
    if tau.ndim < 1 or tau.shape[-1] > n or tau.shape[:-1] != A.shape[:-2]:
        raise ShapeError(f"tau must have shape (*A.shape[:-2], k) with k <= "
                         f"A.shape[-1] (A {A.shape}, tau {tau.shape})")
    return A


@host_op("householder_product", _householder_spec)
def householder_product(a: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The first n columns of the product of Householder matrices H_1 ... H_k (LAPACK orgqr, ungqr for complex)."""
    m, n = a.shape[-2:]
    fa, ft = _flat(a), tau.reshape(-1, tau.shape[-1])
    out = np.empty_like(fa)
    name = "ungqr" if np.iscomplexobj(a) else "orgqr"
    for i in range(fa.shape[0]):
        orgqr = lapack.get_lapack_funcs(name, (fa[i],))
        t = np.zeros(n, a.dtype)
        t[: ft.shape[1]] = ft[i]
        q, _, info = orgqr(fa[i], t, lwork=max(1, 64 * n))
        out[i] = q[:, :n]
    return out.reshape(a.shape)


@householder_product.vjp
def _householder_product_vjp(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
    # Q = (H_1 ... H_k)[:, :n] with H_i = I - tau_i v_i v_i^H, v_i column i of A below a unit diagonal. With
    # P_i = H_1 ... H_{i-1}, S_i = H_{i+1} ... H_k and gQ padded to m x m, gH_i = P_i^H gQ S_i^H, and from
    # dH_i = -dtau v v^H - tau (dv v^H + v dv^H) (derived; the same gradient as torch's householder_product_backward,
    # which needs no inverse of H_i here since the prefix and suffix products are formed explicitly):
    #   g_tau_i = -v^H gH_i v,   g_v_i = -(conj(tau_i) gH_i + tau_i gH_i^H) v   (its entries below the diagonal)
    A, tau = ctx.inputs
    m, n = A.shape[-2:]
    k = tau.shape[-1]
    if k == 0 or math.prod(A.shape) == 0:
        return ember.zeros(A.shape, dtype=A.dtype, device=A.device), ember.zeros(tau.shape, dtype=tau.dtype,
                                                                                 device=tau.device)
    eye = ember.eye(m, dtype=A.dtype, device=A.device)
    V = A.tril(-1) + ember.eye(m, n, dtype=A.dtype, device=A.device)
    gQ = g if m == n else ember.cat([g, ember.zeros((*g.shape[:-1], m - n), dtype=g.dtype, device=g.device)], -1)
    vs = [V[..., :, i:i + 1] for i in range(k)]
    taus = [tau[..., i:i + 1].unsqueeze(-1) for i in range(k)]
    H = [eye - t * (v @ _t(v)) for v, t in zip(vs, taus)]
    suffix: list[Tensor] = [eye] * k
    acc = eye
    for i in reversed(range(k)):
        suffix[i] = acc
        acc = H[i] @ acc
    prefix = eye
    gv_cols, gtaus = [], []
    for i in range(k):
        v, t = vs[i], taus[i]
        gH = _t(prefix) @ gQ @ _t(suffix[i])
        gHv, gHhv = gH @ v, _t(gH) @ v
        gtaus.append(-(_t(v) @ gHv).squeeze(-1))
        tc = t.conj() if t.dtype.is_complex else t
        gv_cols.append(-(tc * gHv) - t * gHhv)
        prefix = prefix @ H[i]
    gV = ember.cat(gv_cols, -1)
    if k < n:
        gV = ember.cat([gV, ember.zeros((*gV.shape[:-1], n - k), dtype=gV.dtype, device=gV.device)], -1)
    return gV.tril(-1), ember.cat(gtaus, -1)


def _eig_spec(A: TensorSpec) -> tuple[TensorSpec, TensorSpec]:
    check_float("eig", A, names=("A",))
    check_square("eig", A)
    if A.dtype.is_complex:
        return _spec(A.shape[:-1], A.dtype), A
    complex_dtype = getattr(ember, "complex64" if A.dtype is dt.float32 else "complex128", None)
    if complex_dtype is None:
        raise UnsupportedError(f"the eigenvalues and eigenvectors of a real matrix are complex in general "
                               f"and this ember has no complex dtypes (complex64/complex128 come with "
                               f"ember-signal's complex support); A {A.shape} {A.dtype.name}. For symmetric matrices "
                               "use linalg.eigh / linalg.eigvalsh.")
    return _spec(A.shape[:-1], complex_dtype), _spec(A.shape, complex_dtype)


@host_op("eig", _eig_spec)
def eig(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eigenvalues, eigenvectors) of a general square matrix, complex (LAPACK geev)."""
    w, v = np.linalg.eig(a)
    ctype = np.complex64 if a.dtype in (np.float32, np.complex64) else np.complex128
    return w.astype(ctype), v.astype(ctype)


@eig.vjp
def _eig_vjp(ctx: Any, gL: Tensor, gV: Tensor) -> Tensor:
    # torch's linalg_eig_backward (general case): gA = V^{-H} (diag(gL) + (V^H gV - V^H V Re diag(V^H gV)) / E) V^H
    # with E_ij = conj(L_j) - conj(L_i); the real part for a real A. Eigenvectors are defined up to a phase: a loss
    # that depends on it (Im diag(V^H gV) != 0) has no gradient, as in torch.
    (A,) = ctx.inputs
    L, V = ctx.outputs
    Vh = _t(V)
    if is_zero(gV):
        d = gL if gL is not None else ember.zeros(L.shape, dtype=L.dtype, device=L.device)
        return _realify(call(solve, Vh, d.unsqueeze(-1) * Vh), A)
    VhgV = Vh @ gV
    diag = VhgV.diagonal(0, -2, -1)
    if not np.allclose(ember.imag(diag).detach().numpy(), 0, rtol=1e-2, atol=1e-2):
        raise AutodiffError("linalg_eig_backward: The eigenvectors in the complex case are specified up to "
                            "multiplication by e^{i phi}. The specified loss function depends on this quantity, so "
                            "it is ill-defined.")
    VhgV = VhgV - Vh @ (V * ember.real(diag).unsqueeze(-2))
    Lc = L.conj()
    n = L.shape[-1]
    E = ember.where(ember.eye(n, dtype=ember.bool, device=L.device), 1, Lc.unsqueeze(-2) - Lc.unsqueeze(-1))
    inner = VhgV / E
    if not is_zero(gL):
        inner = _set_diag(inner, gL)
    return _realify(call(solve, Vh, inner @ Vh), A)


__all__ = ["LinAlgError", "cholesky", "cholesky_ex", "det", "eig", "eigh", "eigvalsh", "householder_product", "inv",
           "inv_ex", "lstsq", "lu_factor_ex", "lu_solve", "matrix_exp", "matrix_rank", "permutation", "pinv",
           "pinv_backward", "qr", "slogdet", "solve", "solve_triangular", "svd", "svdvals", "unpack"]
