"""The worked extension example, examples/extensions/linear_relu.py: ``relu(x @ w.T + b)`` as an
``ember.backend_extension`` with a flex kernel, an OpenCL kernel (bias and ReLU in the GEMM epilogue) and a vjp.

Checked on flex unfused and fused, under autodiff (gradients against finite differences in float64 and against
torch) and on OpenCL (skipped where there is no OpenCL device), against numpy; each device check also counts which
of kernel, composition and vjp ran, so a silent fall back to the composition fails. The kernels are also checked on
their own, called with a backend and its handles (every tile size of the OpenCL kernel, strided inputs, fallbacks).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device
from ember import dtypes as dt
from ember.errors import DeviceError, DTypeError, PluginError, ShapeError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "extensions" / "linear_relu.py"


def _load() -> ModuleType:
    """The example module, imported once per process under the name docs/extensions.md uses too (registering the op
    again from another module name would be refused as a clash)."""
    mod = sys.modules.get("linear_relu")
    if mod is None:
        spec = importlib.util.spec_from_file_location("linear_relu", EXAMPLE)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["linear_relu"] = mod
        spec.loader.exec_module(mod)
    return mod


ex = _load()
op = ex.linear_relu

# (x shape, out features): odd sizes that are no multiple of any tile, batch dims, a vector, several tiles with edges
SHAPES = [((37, 53), 29), ((2, 3, 53), 29), ((53,), 7), ((70, 40), 65), ((1, 1), 1)]
SHAPE_IDS = ["37x53@29", "2x3x53@29", "vector", "70x40@65", "1x1@1"]


def _arrays(xs: tuple[int, ...], n: int, dtype: Any, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(xs).astype(dtype), rng.standard_normal((n, xs[-1])).astype(dtype),
            rng.standard_normal(n).astype(dtype))


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)


def _tol(dtype: Any) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-4} if np.dtype(dtype) == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


@contextmanager
def counting(backend: str) -> Iterator[dict[str, int]]:
    """Counts of the calls of the op's kernel for ``backend``, its composition and its vjp while the block runs."""
    counts = {"kernel": 0, "composition": 0, "vjp": 0}
    kernel, composition, vjp = op.kernels[backend], op.composition, ex._vjp

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return counted

    op.kernel(backend)(wrap("kernel", kernel))  # registering through the API also forgets resolved kernels
    op.vjp(wrap("vjp", vjp))
    op.composition = wrap("composition", composition)
    try:
        yield counts
    finally:
        op.kernel(backend)(kernel)
        op.vjp(vjp)
        op.composition = composition


@pytest.fixture(scope="module")
def opencl() -> Device:
    try:
        dev = Device.parse("opencl")
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"no OpenCL device here: {exc}")
    return dev


# -- registration and the shape rule ----------------------------------------------------------------------------------
def test_the_op_is_registered_and_published() -> None:
    assert ember.examples.linear_relu is op and ember.extension.get("examples.linear_relu") is op
    assert set(op.kernels) == {"flex", "opencl"} and op.has_vjp and not op.fusable
    assert not hasattr(ember.Tensor, "linear_relu")  # method=None: no Tensor method


def test_output_spec_runs_nothing_and_refuses_bad_arguments() -> None:
    spec = op.output_spec(ember.TensorSpec((4, 3, 53), ember.float32), ember.TensorSpec((29, 53), ember.float32),
                          ember.TensorSpec((29,), ember.float32))
    assert spec == ember.TensorSpec((4, 3, 29), ember.float32)
    f32 = ember.float32
    with pytest.raises(ShapeError, match=r"examples\.linear_relu.*shapes do not match"):
        op.output_spec(ember.TensorSpec((2, 5), f32), ember.TensorSpec((3, 4), f32), ember.TensorSpec((3,), f32))
    with pytest.raises(ShapeError, match=r"examples\.linear_relu.*expected x of shape"):
        op.output_spec(ember.TensorSpec((2, 4), f32), ember.TensorSpec((3, 4), f32), ember.TensorSpec((), f32))
    with pytest.raises(DTypeError, match=r"examples\.linear_relu.*float32, float64 and float32"):
        op.output_spec(ember.TensorSpec((2, 4), f32), ember.TensorSpec((3, 4), ember.float64),
                       ember.TensorSpec((3,), f32))
    with pytest.raises(ShapeError, match=r"examples\.linear_relu"):  # a call is refused before any kernel runs
        with counting("flex") as counts:
            op(ember.ones(2, 5), ember.ones(3, 4), ember.ones(3))
    assert counts == {"kernel": 0, "composition": 0, "vjp": 0}


# -- flex, unfused and fused ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["flex", "flex+fusion"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("xs, n", SHAPES, ids=SHAPE_IDS)
def test_flex_runs_the_kernel(device: str, dtype: Any, xs: tuple[int, ...], n: int) -> None:
    dev = Device.parse(device)
    x, w, b = _arrays(xs, n, dtype)
    with counting("flex") as counts:
        out = op(*(ember.tensor(a, device=dev) for a in (x, w, b)))
        got = out.numpy()
    assert counts == {"kernel": 1, "composition": 0, "vjp": 0}
    assert out.shape == (*xs[:-1], n) and out.dtype == dt.from_numpy_dtype(x.dtype) and got.dtype == dtype
    np.testing.assert_allclose(got, _reference(x, w, b), **_tol(dtype))


def test_fused_flex_kernel_is_a_boundary_between_fused_neighbours() -> None:
    dev = Device.parse("flex+fusion(eager_below=0)")  # lazy neighbours: recorded, then computed
    x, w, b = _arrays((5, 3, 8), 6, np.float64, seed=1)
    tx, tw, tb = (ember.tensor(a, device=dev) for a in (x, w, b))
    with counting("flex") as counts:
        got = (op(tx * 2 - 1, tw, tb.exp()) + 1).sum(-1).numpy()  # lazy inputs are computed, then the kernel runs
    assert counts["kernel"] == 1 and counts["composition"] == 0
    np.testing.assert_allclose(got, (_reference(x * 2 - 1, w, np.exp(b)) + 1).sum(-1), rtol=1e-12)


def test_devices_without_a_kernel_run_the_composition() -> None:
    # the composition is the op's definition: a kernel-less device gives the same numbers
    x, w, b = _arrays((4, 9), 5, np.float64, seed=2)
    with counting("flex") as counts:
        op.kernels.pop("flex")
        ember.dispatch.clear_cache()
        got = op(*(ember.tensor(a) for a in (x, w, b))).numpy()
    assert counts == {"kernel": 0, "composition": 1, "vjp": 0}
    np.testing.assert_allclose(got, _reference(x, w, b), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.int32, np.float16], ids=["int32", "float16"])
def test_flex_kernel_falls_back_to_the_backend_primitives_for_other_dtypes(dtype: Any) -> None:
    x, w, b = (np.round(a * 3).astype(dtype) for a in _arrays((3, 4, 6), 5, np.float64, seed=3))
    with counting("flex") as counts:
        out = op(*(ember.tensor(a) for a in (x, w, b)))
    assert counts["kernel"] == 1
    assert out.dtype == dt.from_numpy_dtype(x.dtype)
    np.testing.assert_allclose(out.numpy().astype(np.float64), _reference(x, w, b), rtol=1e-2)


def test_nan_propagates_through_the_relu() -> None:
    x, w, b = _arrays((2, 3), 2, np.float32)
    x[0, 0] = np.nan
    got = op(*(ember.tensor(a, device=Device.parse("flex+fusion(False)")) for a in (x, w, b))).numpy()
    assert np.isnan(got[0]).all() and not np.isnan(got[1]).any()


def test_debug_mode_accepts_the_kernels_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DEBUG", "1")
    x, w, b = _arrays((2, 3, 4), 5, np.float32)
    for device in ("flex", "flex+fusion"):
        got = op(*(ember.tensor(a, device=Device.parse(device)) for a in (x, w, b))).numpy()
        np.testing.assert_allclose(got, _reference(x, w, b), **_tol(np.float32))


# -- gradients --------------------------------------------------------------------------------------------------------
def _away_from_the_kink(x: np.ndarray, w: np.ndarray, b: np.ndarray, margin: float = 1e-3) -> np.ndarray:
    """b shifted so no pre-activation is within margin of 0 (finite differences are wrong across the kink)."""
    z = x @ w.T + b
    near = np.abs(z) < margin
    return b + np.where(near.any(axis=tuple(range(z.ndim - 1))), 4 * margin, 0)


def _torch_grads(x: np.ndarray, w: np.ndarray, b: np.ndarray, g: np.ndarray) -> list[np.ndarray]:
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    torch.relu(tx @ tw.T + tb).backward(torch.tensor(g))
    return [t.grad.numpy() for t in (tx, tw, tb)]


@pytest.mark.parametrize("xs, n", [((4, 6), 5), ((2, 3, 6), 5)], ids=["2d", "3d"])
def test_autodiff_one_node_with_the_vjp_matches_finite_differences_and_torch(xs: tuple[int, ...], n: int) -> None:
    dev = Device.parse("flex+autodiff")
    x, w, b = _arrays(xs, n, np.float64, seed=4)
    b = _away_from_the_kink(x, w, b)
    assert np.abs(x @ w.T + b).min() > 1e-3  # finite differences across the ReLU's kink would be wrong
    g = np.random.default_rng(5).standard_normal((*xs[:-1], n))
    tx, tw, tb = (ember.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
    with counting("flex") as counts:
        out = op(tx, tw, tb)
        (out * ember.tensor(g, device=dev)).sum().backward()
    assert counts == {"kernel": 1, "composition": 0, "vjp": 1}  # the kernel forward, the vjp backward: one node
    np.testing.assert_allclose(out.detach().numpy(), _reference(x, w, b), rtol=1e-12)
    grads = [t.grad.numpy() for t in (tx, tw, tb)]
    for got, want in zip(grads, _torch_grads(x, w, b, g)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)

    def loss(args: list[np.ndarray]) -> float:
        with ember.no_grad():
            return float((op(*(ember.tensor(a, device=dev) for a in args)).numpy() * g).sum())

    eps = 1e-6
    for i, got in enumerate(grads):
        fd = np.zeros_like(got)
        for idx in np.ndindex(got.shape):
            args = [x.copy(), w.copy(), b.copy()]
            args[i][idx] += eps
            up = loss(args)
            args[i][idx] -= 2 * eps
            fd[idx] = (up - loss(args)) / (2 * eps)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-7)


def test_autodiff_runs_the_kernel_when_nothing_is_tracked() -> None:
    # the defect of issue 15: on an autodiff device a backend's kernel was never used, even under no_grad
    dev = Device.parse("flex+autodiff")
    x, w, b = _arrays((3, 4), 2, np.float64)
    tx, tw, tb = (ember.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
    with counting("flex") as counts:
        with ember.no_grad():
            out = op(tx, tw, tb)
        plain = op(*(ember.tensor(a, device=dev) for a in (x, w, b)))
    assert counts == {"kernel": 2, "composition": 0, "vjp": 0}
    assert not out.requires_grad and not plain.requires_grad
    np.testing.assert_allclose(out.numpy(), _reference(x, w, b), rtol=1e-12)


def test_gradient_only_for_the_inputs_that_ask() -> None:
    dev = Device.parse("flex+autodiff")
    x, w, b = _arrays((3, 4), 2, np.float64, seed=6)
    g = np.ones((3, 2))
    tx, tb = ember.tensor(x, device=dev), ember.tensor(b, device=dev)
    tw = ember.tensor(w, device=dev, requires_grad=True)
    op(tx, tw, tb).sum().backward()
    assert tx.grad is None and tb.grad is None
    np.testing.assert_allclose(tw.grad.numpy(), _torch_grads(x, w, b, g)[1], rtol=1e-12)


# -- OpenCL -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("xs, n", SHAPES, ids=SHAPE_IDS)
def test_opencl_runs_the_kernel(opencl: Device, fused: bool, dtype: Any, xs: tuple[int, ...], n: int) -> None:
    dev = opencl.fusion() if fused else opencl.fusion(False)
    if dt.from_numpy_dtype(np.dtype(dtype)) not in opencl.stack.base_backend.supported_dtypes:
        pytest.skip(f"{np.dtype(dtype).name} is not supported on this OpenCL device")
    x, w, b = _arrays(xs, n, dtype)
    with counting("opencl") as counts:
        out = op(*(ember.tensor(a, device=dev) for a in (x, w, b)))
        got = out.numpy()
    assert counts == {"kernel": 1, "composition": 0, "vjp": 0}
    assert out.shape == (*xs[:-1], n) and got.dtype == dtype
    np.testing.assert_allclose(got, _reference(x, w, b), **_tol(dtype))


def test_opencl_debug_mode_accepts_the_kernels_outputs(opencl: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DEBUG", "1")
    x, w, b = _arrays((2, 3, 4), 5, np.float32)
    with counting("opencl") as counts:
        got = op(*(ember.tensor(a, device=opencl) for a in (x, w, b))).numpy()
    assert counts["kernel"] == 1
    np.testing.assert_allclose(got, _reference(x, w, b), **_tol(np.float32))


def test_opencl_strided_inputs_are_made_contiguous(opencl: Device) -> None:
    x, w, b = _arrays((53, 2, 37), 58, np.float32)
    w = np.random.default_rng(7).standard_normal((29, 106)).astype(np.float32)
    tx = ember.tensor(x, device=opencl).permute(1, 2, 0)  # (2, 37, 53), not contiguous
    tw = ember.tensor(w, device=opencl)[:, ::2]  # (29, 53), every other column
    tb = ember.tensor(b, device=opencl)[::2]
    got = op(tx, tw, tb).numpy()
    np.testing.assert_allclose(got, _reference(x.transpose(1, 2, 0), w[:, ::2], b[::2]), **_tol(np.float32))


def test_opencl_autodiff_gradients_match_torch(opencl: Device) -> None:
    dev = Device.parse("opencl+autodiff")
    x, w, b = _arrays((2, 5, 7), 3, np.float32, seed=8)
    g = np.random.default_rng(9).standard_normal((2, 5, 3)).astype(np.float32)
    tx, tw, tb = (ember.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
    with counting("opencl") as counts:
        op(tx, tw, tb).backward(ember.tensor(g, device=dev))
    assert counts == {"kernel": 1, "composition": 0, "vjp": 1}
    for t, want in zip((tx, tw, tb), _torch_grads(x, w, b, g)):
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-4, atol=1e-5)


# -- the kernels on their own, on a backend and its handles ------------------------------------------------------------
@pytest.mark.parametrize("ts", [32, 16, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_opencl_kernel_every_tile_size(opencl: Device, monkeypatch: pytest.MonkeyPatch, ts: int, dtype: Any) -> None:
    backend = opencl.stack.base_backend
    if dt.from_numpy_dtype(np.dtype(dtype)) not in backend.supported_dtypes:
        pytest.skip(f"{np.dtype(dtype).name} is not supported on this OpenCL device")
    monkeypatch.setattr(ex, "_tile", lambda rt, itemsize: ts)
    for (xs, n), seed in zip(SHAPES + [((0, 5), 3), ((4, 0), 3)], range(10)):
        x, w, b = _arrays(xs, n, dtype, seed)
        got = backend.to_numpy(ex._opencl(backend, *(backend.from_numpy(a) for a in (x, w, b))))
        assert got.shape == (*xs[:-1], n), (ts, xs, n)
        np.testing.assert_allclose(got, _reference(x, w, b), **_tol(dtype), err_msg=f"tile {ts}, {xs} @ {n}")


@pytest.mark.parametrize("device", ["flex", "opencl"])
def test_kernels_fall_back_to_primitives_for_integers(request: pytest.FixtureRequest, device: str) -> None:
    backend = (request.getfixturevalue("opencl") if device == "opencl" else Device.parse("flex")).stack.base_backend
    kernel = ex._opencl if device == "opencl" else ex._flex
    x, w, b = (np.round(a * 4).astype(np.int64) for a in _arrays((2, 5, 6), 4, np.float64, seed=11))
    got = backend.to_numpy(kernel(backend, *(backend.from_numpy(a) for a in (x, w, b))))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.maximum(x @ w.T + b, 0))


def test_main_compares_with_numpy(capsys: pytest.CaptureFixture[str]) -> None:
    ex.main(["flex"])
    line = capsys.readouterr().out
    assert "examples.linear_relu on flex: output (4, 37, 29)" in line
    assert float(line.rsplit(" ", 1)[1]) < 1e-4


def test_the_example_runs_as_a_script(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "flex+autodiff"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "examples.linear_relu on flex+autodiff: output (4, 37, 29)" in proc.stdout
