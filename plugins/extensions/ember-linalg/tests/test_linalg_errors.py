"""ember-linalg on bad and edge input (torch as the oracle of messages and info codes), its registration (the
namespace, kernels per backend), and batch shapes drawn by hypothesis."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember.errors import DTypeError, EmberError, ShapeError, UnsupportedError

LA = ember.linalg


def e(a: np.ndarray, **kw: object) -> ember.Tensor:
    return ember.tensor(np.asarray(a), **kw)


def singular_batch() -> np.ndarray:
    a = np.stack([np.eye(3), np.eye(3), np.eye(3)])
    a[1, 2, 2] = 0.0  # batch element 1 is singular at pivot 3
    return a


# -- singular and indefinite matrices -----------------------------------------------------------------------------
def test_linalg_error_type_is_published_and_typed() -> None:
    assert LA.LinAlgError is __import__("ember_linalg").LinAlgError
    assert issubclass(LA.LinAlgError, EmberError) and issubclass(LA.LinAlgError, RuntimeError)


def test_inv_singular_raises_torchs_message_naming_the_batch_element() -> None:
    a = singular_batch()
    with pytest.raises(torch.linalg.LinAlgError) as want:
        torch.linalg.inv(torch.from_numpy(a))
    with pytest.raises(LA.LinAlgError) as got:
        LA.inv(e(a))
    assert str(got.value) == str(want.value)
    assert "(Batch element 1)" in str(got.value)
    with pytest.raises(LA.LinAlgError, match=r"^linalg\.inv: The diagonal element 3 is zero"):  # no batch: no prefix
        LA.inv(e(a[1]))


def test_cholesky_not_positive_definite_matches_torch() -> None:
    a = np.stack([np.eye(3), np.diag([1.0, -1.0, 1.0])])
    with pytest.raises(torch.linalg.LinAlgError) as want:
        torch.linalg.cholesky(torch.from_numpy(a))
    with pytest.raises(LA.LinAlgError) as got:
        LA.cholesky(e(a))
    assert str(got.value) == str(want.value)


def test_solve_and_lu_factor_singular() -> None:
    a = singular_batch()
    with pytest.raises(LA.LinAlgError, match=r"linalg\.solve: \(Batch element 1\): The solver failed because the "
                                             r"input matrix is singular"):
        LA.solve(e(a), e(np.ones((3, 3, 1))))
    with pytest.raises(RuntimeError) as want:
        torch.linalg.lu_factor(torch.from_numpy(a[1]))
    with pytest.raises(LA.LinAlgError) as got:
        LA.lu_factor(e(a[1]))
    assert str(got.value) == str(want.value).replace("torch.linalg", "linalg")


@pytest.mark.parametrize("fn", ["inv_ex", "cholesky_ex", "lu_factor_ex"])
def test_ex_variants_return_torchs_info_instead_of_raising(fn: str) -> None:
    a = singular_batch()
    a[2] = np.diag([1.0, 1.0, -2.0])  # not positive-definite at order 3 (invertible)
    want = getattr(torch.linalg, fn)(torch.from_numpy(a))
    got = getattr(LA, fn)(e(a))
    assert got.info.dtype == ember.int32
    np.testing.assert_array_equal(got.info.numpy(), want.info.numpy())
    with pytest.raises(LA.LinAlgError, match=rf"linalg\.{fn}: \(Batch element 1\)"):
        getattr(LA, fn)(e(a), check_errors=True)


def test_solve_ex_gives_nan_for_the_singular_element_only() -> None:
    a = singular_batch()
    res, info = LA.solve_ex(e(a), e(np.ones((3, 3))))
    np.testing.assert_array_equal(info.numpy(), [0, 3, 0])
    out = res.numpy()
    assert np.isnan(out[1]).all() and np.allclose(out[[0, 2]], 1.0)


def test_singular_triangular_solve_gives_inf_like_torch() -> None:
    a = np.triu(np.ones((3, 3)))
    a[1, 1] = 0.0
    b = np.ones((3, 2))
    want = torch.linalg.solve_triangular(torch.from_numpy(a), torch.from_numpy(b), upper=True).numpy()
    got = LA.solve_triangular(e(a), e(b), upper=True).numpy()
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))


def test_singular_det_slogdet_and_det_gradient() -> None:
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])  # rank 2
    sign, logabs = LA.slogdet(e(a))
    assert sign.item() == 0 and logabs.item() == -np.inf
    x = e(a, device=ember.device("flex+autodiff"), requires_grad=True)
    LA.det(x).backward()
    t = torch.tensor(a, requires_grad=True)
    torch.linalg.det(t).backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-10)  # the adjugate: finite at singular A


# -- bad shapes and dtypes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["inv", "det", "slogdet", "cholesky", "eigh", "eigvalsh", "matrix_exp", "inv_ex"])
def test_non_square_is_a_shape_error_naming_function_and_shape(fn: str) -> None:
    with pytest.raises(ShapeError, match=rf"linalg\.{fn}: .*A must be batches of square matrices, but they are 3 by 4 "
                                         r"matrices \(shape \(2, 3, 4\)\)"):
        getattr(LA, fn)(ember.ones(2, 3, 4))


@pytest.mark.parametrize("fn", ["inv", "det", "svd", "qr", "cholesky", "pinv", "matrix_rank", "lu_factor"])
def test_integer_input_is_a_dtype_error(fn: str) -> None:
    with pytest.raises(DTypeError,
                       match=rf"linalg\.{fn}.*: .*Expected a floating point or complex tensor .* Got int64"):
        getattr(LA, fn)(ember.ones(3, 3, dtype=ember.int64))


def test_mismatched_batch_and_rhs_shapes_and_dtypes() -> None:
    with pytest.raises(ShapeError, match=r"linalg\.solve: .*the batch dimensions .* A \(2,\), B \(4,\)"):
        LA.solve(ember.ones(2, 3, 3), ember.ones(4, 3, 1))
    with pytest.raises(ShapeError, match=r"linalg\.solve: .*Incompatible shapes .*3x3 and 4x1"):
        LA.solve(ember.ones(3, 3), ember.ones(4, 1))
    with pytest.raises(DTypeError, match=r"linalg\.solve: .*A of dtype float32 and B of dtype float64"):
        LA.solve(ember.ones(3, 3), ember.ones(3, 1, dtype=ember.float64))
    with pytest.raises(ShapeError, match=r"linalg\.svd: .*The input tensor A must have at least 2 dimensions"):
        LA.svd(ember.ones(3))
    with pytest.raises(ShapeError, match=r"linalg\.qr: .*qr received unrecognized mode 'economic'"):
        LA.qr(ember.ones(3, 3), mode="economic")
    with pytest.raises(ShapeError, match=r"linalg\.cross: inputs dimension -1 must have length 3"):
        LA.cross(ember.ones(2, 4), ember.ones(2, 4))
    with pytest.raises(ShapeError, match=r"linalg\.multi_dot: tensors 0 and 1 cannot be multiplied"):
        LA.multi_dot([ember.ones(2, 3), ember.ones(2, 3)])


def test_eig_is_typed_unsupported_without_complex_dtypes() -> None:
    a = e(np.array([[0.0, -1.0], [1.0, 0.0]]))
    if hasattr(ember, "complex64"):
        w = LA.eigvals(a).numpy()
        np.testing.assert_allclose(np.sort_complex(w), np.sort_complex(np.linalg.eigvals(a.numpy())))
        return
    with pytest.raises(UnsupportedError, match=r"linalg\.eig: .*no complex dtypes.*linalg\.eigh"):
        LA.eig(a)
    with pytest.raises(UnsupportedError, match=r"linalg\.eig"):
        LA.eigvals(a)


def test_qr_mode_r_and_complete_tall_are_not_differentiable() -> None:
    dev = ember.device("flex+autodiff")
    x = ember.ones(4, 3, device=dev, requires_grad=True) + e(np.eye(4, 3), device=dev)
    with pytest.raises(UnsupportedError, match=r"linalg\.qr: .*mode='r'"):
        LA.qr(x, mode="r")[1].sum().backward()
    with pytest.raises(UnsupportedError, match=r"mode='complete' and nrows > ncols"):
        LA.qr(x, mode="complete")[0].sum().backward()


# -- degenerate spectra: torch's documented gradient behaviour ------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_eigvalsh_gradient_is_finite_for_repeated_eigenvalues_eigh_vectors_are_not() -> None:
    dev = ember.device("flex+autodiff")
    a = np.eye(3)
    x = e(a, device=dev, requires_grad=True)
    (LA.eigvalsh(x) * e(np.array([1.0, 2.0, 3.0]), device=dev)).sum().backward()
    t = torch.tensor(a, requires_grad=True)
    (torch.linalg.eigvalsh(t) * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-12)
    y = e(a, device=dev, requires_grad=True)
    LA.eigh(y).eigenvectors[0].sum().backward()
    assert not np.isfinite(y.grad.numpy()).all()  # torch: "the gradient is not defined" (division by zero)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the 0/0 of the undefined gradient itself
def test_svd_gauge_warning_for_repeated_singular_values() -> None:
    dev = ember.device("flex+autodiff")
    x = e(np.eye(3), device=dev, requires_grad=True)
    with pytest.warns(UserWarning, match=r"linalg\.svd: .*repeated singular values"):
        LA.svd(x).U.sum().backward()
    y = e(np.eye(3), device=dev, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # singular values alone: no warning, a finite gradient
        LA.svdvals(y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), np.eye(3))


# -- registration: namespace, kernels on each backend -----------------------------------------------------------------
def test_namespace_keeps_core_names_and_lists_the_plugins() -> None:
    from ember.ops.linalg import matmul

    assert LA.matmul is matmul  # core's names win
    assert LA.cholesky is __import__("ember_linalg.api", fromlist=["cholesky"]).cholesky
    assert LA.cholesky.__doc__ and "positive-definite" in LA.cholesky.__doc__
    op = ember.extension.get("linalg.cholesky")
    assert op is not None and op.has_vjp and "flex" in op.kernels


def test_toy_backend_gets_the_host_kernel_on_first_use() -> None:
    try:
        dev = ember.device("toy")
    except EmberError as exc:
        pytest.skip(f"toy example backend not installed: {exc}")
    a = np.array([[4.0, 1.0], [1.0, 3.0]])
    out = LA.inv(e(a, device=dev))
    assert out.device == dev
    np.testing.assert_allclose(out.numpy(), np.linalg.inv(a))
    assert "toy" in ember.extension.get("linalg.inv").kernels


def test_fused_neighbours_around_a_linalg_boundary() -> None:
    dev = ember.device("flex+fusion(eager_below=0)")
    a = np.random.default_rng(0).standard_normal((3, 4, 4)) + 4 * np.eye(4)
    x = e(a, device=dev)
    got = (LA.inv(x * 2 - 1) + 1).sum(-1).numpy()
    np.testing.assert_allclose(got, (np.linalg.inv(a * 2 - 1) + 1).sum(-1), rtol=1e-12)


# -- hypothesis: batch dims and sizes ---------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(batch=st.lists(st.integers(1, 3), min_size=0, max_size=2), n=st.integers(1, 5), k=st.integers(1, 3),
       seed=st.integers(0, 2**16), bcast=st.booleans())
def test_batched_shapes_match_torch(batch: list[int], n: int, k: int, seed: int, bcast: bool) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*batch, n, n))
    a = x @ np.swapaxes(x, -1, -2) + n * np.eye(n)  # SPD: every routine applies
    b = rng.standard_normal((*([1] * len(batch) if bcast else batch), n, k))
    ta, tb, ea, eb = torch.from_numpy(a), torch.from_numpy(b), e(a), e(b)
    pairs = [
        (LA.solve(ea, eb), torch.linalg.solve(ta, tb)),
        (LA.inv(ea), torch.linalg.inv(ta)),
        (LA.det(ea), torch.linalg.det(ta)),
        (LA.cholesky(ea), torch.linalg.cholesky(ta)),
        (LA.eigvalsh(ea), torch.linalg.eigvalsh(ta)),
        (LA.svdvals(eb), torch.linalg.svdvals(tb)),
        (LA.solve_triangular(LA.cholesky(ea), eb, upper=False),
         torch.linalg.solve_triangular(torch.linalg.cholesky(ta), tb, upper=False)),
        (LA.lu_solve(*LA.lu_factor(ea), eb), torch.linalg.lu_solve(*torch.linalg.lu_factor(ta), tb)),
    ]
    for got, want in pairs:
        assert tuple(got.shape) == tuple(want.shape)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-9)


def test_without_the_plugin_the_names_raise_missing_plugin_error_naming_the_extra() -> None:
    import os
    import subprocess
    import sys

    code = ("import ember\n"
            "from ember.errors import MissingPluginError\n"
            "assert ember.linalg.vector_norm is not None and ember.linalg.matmul is not None  # core's stay\n"
            "try:\n"
            "    ember.linalg.cholesky\n"
            "except MissingPluginError as exc:\n"
            "    print(exc)\n")
    env = {**os.environ, "EMBER_DISABLE_PLUGINS": "linalg"}
    env.pop("EMBER_STRICT_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ember.linalg.cholesky" in out.stdout and "ember-linalg" in out.stdout and "pip install" in out.stdout
