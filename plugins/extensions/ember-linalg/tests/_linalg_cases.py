"""Cases shared by ember-linalg's tests: each case is written once against a ``linalg`` module and runs on both
``ember.linalg`` and ``torch.linalg`` (the oracle), with the same numpy inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device
from ember.errors import DeviceError, PluginError

#: devices the value tests run on; toy (the third-party example backend: host fallback) and OpenCL skip when absent
DEVICES = ["flex", "flex+autodiff", "flex+fusion(eager_below=0)", "toy", "opencl"]
#: devices the gradient tests run on
GRAD_DEVICES = ["flex+autodiff", "flex+fusion(eager_below=0)+autodiff", "toy+autodiff", "opencl+autodiff"]


def device(name: str) -> Device:
    """The device ``name``, or a skip naming why it is not available here."""
    try:
        dev = Device.parse(name)
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"device {name} not available here: {exc}")
    return dev


def sq(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Well-conditioned square matrices: gaussian plus n on the diagonal."""
    n = shape[-1]
    return rng.standard_normal(shape) + n * np.eye(n)


def spd(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.standard_normal(shape)
    return x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1])


def gauss(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def tri(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Full matrices whose lower triangle is well conditioned (the upper one is noise the op must not read)."""
    return sq(rng, *shape)


@dataclass
class Case:
    """``fn(linalg, *tensors)`` returns a tensor or a tuple; ``abs_outputs`` are compared (and weighted in the
    gradient loss) up to sign, as eigen/singular vectors are only defined up to sign."""

    id: str
    fn: Callable[..., Any]
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    abs_outputs: tuple[int, ...] = ()
    grad: bool = True
    torch_grad: bool = True  # torch autograd as the gradient oracle (else finite differences only)
    symmetric: bool = False  # the op reads one triangle of a symmetric input: perturb symmetrically
    skip_outputs: tuple[int, ...] = ()  # outputs left out of the comparison (e.g. rank-dependent shapes)
    kw: dict[str, Any] = field(default_factory=dict)


def _r(*shapes: tuple[Callable[..., np.ndarray], tuple[int, ...]]) -> Callable[[np.random.Generator], list[np.ndarray]]:
    return lambda rng: [make(rng, *shape) for make, shape in shapes]


CASES: list[Case] = [
    Case("solve", lambda L, A, B: L.solve(A, B), _r((sq, (3, 4, 4)), (gauss, (4, 2)))),
    Case("solve_vector", lambda L, A, B: L.solve(A, B), _r((sq, (2, 3, 3)), (gauss, (2, 3)))),
    Case("solve_left_false", lambda L, A, B: L.solve(A, B, left=False), _r((sq, (4, 4)), (gauss, (2, 3, 4)))),
    Case("inv", lambda L, A: L.inv(A), _r((sq, (2, 3, 3)),)),
    Case("inv_ex", lambda L, A: L.inv_ex(A)[0], _r((sq, (3, 3)),)),
    Case("det", lambda L, A: L.det(A), _r((gauss, (2, 4, 4)),)),
    Case("slogdet", lambda L, A: tuple(L.slogdet(A)), _r((gauss, (3, 3, 3)),)),
    Case("cholesky", lambda L, A: L.cholesky(A), _r((spd, (2, 4, 4)),), symmetric=True),
    Case("cholesky_upper", lambda L, A: L.cholesky(A, upper=True), _r((spd, (3, 3)),)),
    Case("cholesky_ex", lambda L, A: L.cholesky_ex(A)[0], _r((spd, (3, 3)),)),
    Case("solve_triangular_lower", lambda L, A, B: L.solve_triangular(A, B, upper=False),
         _r((tri, (2, 4, 4)), (gauss, (2, 4, 3)))),
    Case("solve_triangular_upper_right_unit",
         lambda L, A, B: L.solve_triangular(A, B, upper=True, left=False, unitriangular=True),
         _r((tri, (3, 3)), (gauss, (2, 5, 3)))),
    Case("eigh", lambda L, A: tuple(L.eigh(A)), _r((spd, (2, 4, 4)),), abs_outputs=(1,), symmetric=True),
    Case("eigh_upper", lambda L, A: tuple(L.eigh(A, UPLO="U")), _r((gauss, (3, 3)),), abs_outputs=(1,)),
    Case("eigvalsh", lambda L, A: L.eigvalsh(A), _r((gauss, (2, 3, 3)),)),
    Case("svd_reduced_tall", lambda L, A: tuple(L.svd(A, full_matrices=False)), _r((gauss, (2, 5, 3)),),
         abs_outputs=(0, 2)),
    Case("svd_reduced_wide", lambda L, A: tuple(L.svd(A, full_matrices=False)), _r((gauss, (3, 5)),),
         abs_outputs=(0, 2)),
    Case("svd_full", lambda L, A: tuple(L.svd(A)), _r((gauss, (4, 3)),), abs_outputs=(0, 2)),
    Case("svdvals", lambda L, A: L.svdvals(A), _r((gauss, (2, 3, 5)),)),
    Case("qr_reduced_tall", lambda L, A: tuple(L.qr(A)), _r((gauss, (2, 5, 3)),)),
    Case("qr_reduced_wide", lambda L, A: tuple(L.qr(A)), _r((gauss, (3, 5)),)),
    Case("qr_complete", lambda L, A: tuple(L.qr(A, mode="complete")), _r((gauss, (3, 5)),)),
    Case("qr_r", lambda L, A: L.qr(A, mode="r")[1], _r((gauss, (5, 3)),), grad=False),
    Case("lstsq", lambda L, A, B: L.lstsq(A, B)[0], _r((gauss, (2, 6, 3)), (gauss, (2, 6, 2)))),
    Case("lstsq_gelsd", lambda L, A, B: tuple(L.lstsq(A, B, driver="gelsd")), _r((gauss, (5, 3)), (gauss, (5, 2)))),
    Case("lstsq_vector", lambda L, A, B: L.lstsq(A, B)[0], _r((gauss, (5, 3)), (gauss, (5,)))),
    Case("pinv", lambda L, A: L.pinv(A), _r((gauss, (2, 3, 5)),)),
    Case("pinv_tall", lambda L, A: L.pinv(A), _r((gauss, (5, 3)),)),
    Case("pinv_hermitian", lambda L, A: L.pinv(A + A.mT, hermitian=True), _r((gauss, (4, 4)),)),
    Case("pinv_atol", lambda L, A: L.pinv(A, atol=0.5), _r((gauss, (4, 4)),), grad=False),
    Case("matrix_rank", lambda L, A: L.matrix_rank(A @ A.mT), _r((gauss, (2, 5, 3)),), grad=False),
    Case("lu", lambda L, A: tuple(L.lu(A)), _r((gauss, (2, 4, 4)),)),
    Case("lu_wide", lambda L, A: tuple(L.lu(A)), _r((gauss, (3, 5)),)),
    Case("lu_tall", lambda L, A: tuple(L.lu(A)), _r((gauss, (5, 3)),)),
    Case("lu_factor", lambda L, A: L.lu_factor(A)[0], _r((gauss, (2, 4, 4)),)),
    Case("lu_solve", lambda L, A, B: L.lu_solve(*L.lu_factor(A), B), _r((sq, (2, 3, 3)), (gauss, (2, 3, 2)))),
    Case("lu_solve_adjoint_right", lambda L, A, B: L.lu_solve(*L.lu_factor(A), B, left=False, adjoint=True),
         _r((sq, (3, 3)), (gauss, (2, 3)))),
    Case("matrix_exp", lambda L, A: L.matrix_exp(A), _r((gauss, (2, 3, 3)),)),
    Case("matrix_norm_fro", lambda L, A: L.matrix_norm(A), _r((gauss, (2, 3, 4)),)),
    Case("matrix_norm_nuc", lambda L, A: L.matrix_norm(A, "nuc"), _r((gauss, (2, 3, 4)),)),
    Case("matrix_norm_2", lambda L, A: L.matrix_norm(A, 2, keepdim=True), _r((gauss, (3, 4)),)),
    Case("matrix_norm_m2", lambda L, A: L.matrix_norm(A, -2), _r((gauss, (2, 4, 3)),)),
    Case("matrix_norm_1", lambda L, A: L.matrix_norm(A, 1, dim=(0, 2)), _r((gauss, (3, 2, 4)),)),
    Case("matrix_norm_minf", lambda L, A: L.matrix_norm(A, -float("inf")), _r((gauss, (2, 3, 4)),)),
    Case("norm_default", lambda L, A: L.norm(A), _r((gauss, (2, 3, 4)),)),
    Case("norm_matrix_inf", lambda L, A: L.norm(A, float("inf")), _r((gauss, (3, 4)),)),
    Case("norm_vector_dim", lambda L, A: L.norm(A, 3, dim=1), _r((gauss, (3, 4)),)),
    Case("cond", lambda L, A: L.cond(A), _r((gauss, (2, 3, 3)),)),
    # torch's own backward of cond(p='fro') fails (an in-place inv_ex output): checked by finite differences only
    Case("cond_fro", lambda L, A: L.cond(A, "fro"), _r((sq, (3, 3)),), torch_grad=False),
    Case("matrix_power_3", lambda L, A: L.matrix_power(A, 3), _r((gauss, (2, 3, 3)),)),
    Case("matrix_power_m2", lambda L, A: L.matrix_power(A, -2), _r((sq, (3, 3)),)),
    Case("matrix_power_0", lambda L, A: L.matrix_power(A, 0), _r((gauss, (2, 3, 3)),), grad=False),
    Case("cross", lambda L, a, b: L.cross(a, b), _r((gauss, (1, 4, 3)), (gauss, (2, 1, 3)))),
    Case("diagonal", lambda L, A: L.diagonal(A, offset=1), _r((gauss, (2, 3, 4)),)),
    Case("vander", lambda L, x: L.vander(x, N=4), _r((gauss, (2, 3)),)),
    Case("multi_dot", lambda L, a, b, c, d: L.multi_dot([a, b, c, d]),
         _r((gauss, (4,)), (gauss, (4, 6)), (gauss, (6, 2)), (gauss, (2,)))),
    # complex outputs (ember's complex dtypes); eigenvectors are defined up to a phase: compared in magnitude
    Case("eig", lambda L, A: tuple(L.eig(A)), _r((gauss, (2, 4, 4)),), abs_outputs=(1,), grad=False),
    Case("eigvals", lambda L, A: L.eigvals(A), _r((gauss, (3, 3)),), grad=False),
    Case("vecdot", lambda L, x, y: L.vecdot(x, y, dim=0), _r((gauss, (3, 4)), (gauss, (3, 1)))),
    Case("tensorinv", lambda L, A: L.tensorinv(A.reshape(2, 3, 6), ind=2), _r((sq, (6, 6)),)),
    Case("tensorsolve", lambda L, A, B: L.tensorsolve(A.reshape(6, 2, 3), B), _r((sq, (6, 6)), (gauss, (6,)))),
    Case("householder_product", lambda L, A, tau: L.householder_product(A, tau),
         _r((gauss, (2, 4, 3)), (gauss, (2, 2)))),
]

CASE_IDS = [c.id for c in CASES]


def to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x.detach().numpy())


def outputs(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, tuple) else (out,)
