"""ember.fft against torch.fft (the oracle): values on flex, flex+autodiff, fused flex and OpenCL, gradients (each
op's vjp directly, and end to end through ember-autodiff), bad input, and the typed error of a backend without
complex dtypes (toy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import Device
from ember.errors import DeviceError, DimError, DTypeError, PluginError, ShapeError, ValueRangeError

DEVICES = ["flex", "flex+autodiff", "flex+fusion(eager_below=0)", "opencl"]


def device(name: str) -> Device:
    """The device ``name``, or a skip naming why it is not available here."""
    try:
        dev = Device.parse(name)
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"device {name} not available here: {exc}")
    return dev


def complex_tracked() -> bool:
    """Whether ember-autodiff records complex outputs (the request S18 made of it); gradient tests that pass through
    a complex intermediate need it."""
    dev = device("flex+autodiff")
    x = ember.ones(2, device=dev, requires_grad=True)
    return bool(ember.complex(x, x).requires_grad)


def need_complex_autodiff() -> None:
    if not complex_tracked():
        pytest.skip("ember-autodiff does not record complex outputs of extension ops yet (backend.run_extension "
                    "gates on is_floating_point); the vjps are checked directly in test_vjp_matches_torch")


def close(got: ember.Tensor, want: torch.Tensor, tol: float = 1e-4) -> None:
    g = got.numpy()
    w = want.detach().resolve_conj().numpy()
    assert g.shape == w.shape, (g.shape, w.shape)
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
    np.testing.assert_allclose(g, w, atol=tol * scale, rtol=tol)


RNG = np.random.default_rng(0)
REAL = RNG.standard_normal((3, 6, 8)).astype(np.float32)
CPLX = (RNG.standard_normal((3, 6, 8)) + 1j * RNG.standard_normal((3, 6, 8))).astype(np.complex64)

# (id, function name, input, kwargs): the same call on ember.fft and torch.fft
CASES: list[tuple[str, str, np.ndarray, dict[str, Any]]] = [
    ("fft-real", "fft", REAL, {}),
    ("fft-complex-n5-dim1", "fft", CPLX, {"n": 5, "dim": 1}),
    ("fft-pad-ortho", "fft", CPLX, {"n": 11, "norm": "ortho"}),
    ("ifft-forward", "ifft", CPLX, {"norm": "forward"}),
    ("rfft", "rfft", REAL, {}),
    ("rfft-n7-dim0", "rfft", REAL, {"n": 7, "dim": 0}),
    ("irfft", "irfft", CPLX, {}),
    ("irfft-n9-ortho", "irfft", CPLX, {"n": 9, "norm": "ortho"}),
    ("hfft", "hfft", CPLX, {}),
    ("hfft-n6-forward", "hfft", CPLX, {"n": 6, "norm": "forward"}),
    ("ihfft", "ihfft", REAL, {}),
    ("ihfft-n5-ortho", "ihfft", REAL, {"n": 5, "norm": "ortho"}),
    ("fft2", "fft2", CPLX, {}),
    ("ifft2-s", "ifft2", CPLX, {"s": (4, 10)}),
    ("rfft2", "rfft2", REAL, {"norm": "ortho"}),
    ("irfft2", "irfft2", CPLX, {}),
    ("irfft2-s", "irfft2", CPLX, {"s": (5, 7)}),
    ("fftn-all", "fftn", REAL, {}),
    ("fftn-s", "fftn", CPLX, {"s": (3, 9)}),
    ("ifftn-dims", "ifftn", CPLX, {"dim": (0, 2), "norm": "forward"}),
    ("rfftn", "rfftn", REAL, {"dim": (0, 1)}),
    ("irfftn", "irfftn", CPLX, {"s": (4, 6, 10)}),
    ("fftshift", "fftshift", REAL, {}),
    ("ifftshift-dim", "ifftshift", REAL, {"dim": (1, 2)}),
]


@pytest.mark.parametrize("dev_name", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_match_torch(dev_name: str, case: tuple[str, str, np.ndarray, dict[str, Any]]) -> None:
    dev = device(dev_name)
    _, fn, arr, kw = case
    got = getattr(ember.fft, fn)(ember.tensor(arr, device=dev), **kw)
    want = getattr(torch.fft, fn)(torch.from_numpy(arr), **kw)
    close(got, want)


def test_float64_stays_double_and_ints_promote() -> None:
    x = np.arange(8.0)
    got = ember.fft.fft(ember.tensor(x, dtype=ember.float64))
    assert got.dtype is ember.complex128
    close(got, torch.fft.fft(torch.tensor(x, dtype=torch.float64)), 1e-12)
    gi = ember.fft.rfft(ember.arange(8))
    assert gi.dtype is ember.complex64
    close(gi, torch.fft.rfft(torch.arange(8)))


@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), n=st.none() | st.integers(1, 9),
       norm=st.sampled_from([None, "backward", "forward", "ortho"]), data=st.data())
@settings(max_examples=25, deadline=None)
def test_fft_rfft_shapes_match_torch(shape: list[int], n: int | None, norm: str | None, data: Any) -> None:
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    arr = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    for fn in ("fft", "rfft", "ihfft"):
        close(getattr(ember.fft, fn)(ember.tensor(arr), n=n, dim=dim, norm=norm),
              getattr(torch.fft, fn)(torch.from_numpy(arr), n=n, dim=dim, norm=norm))


def test_freqs_match_torch() -> None:
    for n in (1, 4, 7):
        close(ember.fft.fftfreq(n, d=0.5), torch.fft.fftfreq(n, d=0.5))
        close(ember.fft.rfftfreq(n), torch.fft.rfftfreq(n))
    assert ember.fft.fftfreq(4, dtype=ember.float64).dtype is ember.float64


# -- gradients ---------------------------------------------------------------------------------------------------
def _torch_vjp(fn: Callable[..., torch.Tensor], arr: np.ndarray, g: np.ndarray, kw: dict[str, Any]) -> np.ndarray:
    x = torch.from_numpy(arr.astype(np.complex128 if arr.dtype.kind == "c" else np.float64)).requires_grad_()
    y = fn(x, **kw)
    (gx,) = torch.autograd.grad(y, x, torch.from_numpy(g))
    return gx.resolve_conj().numpy()


GRAD_CASES = [c for c in CASES if c[1] not in ("fftshift", "ifftshift")]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_vjp_matches_torch(case: tuple[str, str, np.ndarray, dict[str, Any]]) -> None:
    """Each transform's vjp (run through the ops' backward, as autodiff does) against torch autograd, float64."""
    _, fn, arr, kw = case
    arr = arr.astype(np.complex128 if arr.dtype.kind == "c" else np.float64)
    want_y = getattr(torch.fft, fn)(torch.from_numpy(arr), **kw)
    rng = np.random.default_rng(1)
    g = rng.standard_normal(want_y.shape)
    if want_y.is_complex():
        g = g + 1j * rng.standard_normal(want_y.shape)
    want = _torch_vjp(getattr(torch.fft, fn), arr, g, kw)
    got = _ember_vjp(getattr(ember.fft, fn), arr, g, kw)
    np.testing.assert_allclose(got, want, atol=1e-9, rtol=1e-9)


def _ember_vjp(fn: Callable[..., ember.Tensor], arr: np.ndarray, g: np.ndarray, kw: dict[str, Any]) -> np.ndarray:
    """The gradient of sum(Re(conj(g) * fn(x))) (torch's grad_outputs=g), via a recording of the extension ops
    fn runs and their vjps in reverse order (no autodiff involved)."""
    from ember.extension import ExtensionOp

    tape: list[tuple[ExtensionOp, tuple[Any, ...], ember.Tensor, dict[str, Any]]] = []
    originals: dict[str, Any] = {}
    import ember_signal._ops as ops
    import ember_signal.fft as fft_mod

    def recording(op: ExtensionOp) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = op(*args, **kwargs)
            tape.append((op, args, out, kwargs))
            return out

        return call

    for name in ("c2c", "r2c", "c2r"):
        originals[name] = getattr(fft_mod, name)
        setattr(fft_mod, name, recording(getattr(ops, name)))
    conj_calls: list[tuple[ember.Tensor, ember.Tensor]] = []
    real_conj = ember.conj

    def conj(t: ember.Tensor) -> ember.Tensor:
        out = real_conj(t)
        conj_calls.append((t, out))
        tape.append((None, (t,), out, {}))  # type: ignore[arg-type]
        return out

    fft_mod.ember.conj = conj  # type: ignore[attr-defined]
    try:
        x = ember.tensor(arr)
        y = fn(x, **kw)
    finally:
        for name, f in originals.items():
            setattr(fft_mod, name, f)
        fft_mod.ember.conj = real_conj  # type: ignore[attr-defined]
    grads: dict[int, ember.Tensor] = {id(y): ember.tensor(g.astype(y.numpy().dtype))}
    for op, args, out, kwargs in reversed(tape):
        gout = grads.pop(id(out))
        if op is None:  # conj: its vjp is conj
            gin = real_conj(gout)
        else:
            (gin,) = op.backward(args, (out,), (gout,), kwargs)
        src = args[0]
        if src is x and not x.dtype.is_complex and gin.dtype.is_complex:
            gin = ember.real(gin)
        grads[id(src)] = gin
    return grads[id(x)].numpy()


@pytest.mark.parametrize("fn,arr,kw", [("rfft", REAL, {}), ("fft", REAL, {"n": 12, "norm": "ortho"}),
                                       ("irfft", CPLX, {"n": 10}), ("fft2", CPLX, {}), ("hfft", CPLX, {})],
                         ids=["rfft", "fft-real-n12", "irfft-n10", "fft2-complex", "hfft"])
@pytest.mark.parametrize("dev_name", ["flex+autodiff", "flex+fusion(eager_below=0)+autodiff", "opencl+autodiff"])
def test_autodiff_gradients_match_torch(dev_name: str, fn: str, arr: np.ndarray, kw: dict[str, Any]) -> None:
    """End to end on a differentiable device: a real loss of the complex result (|y|^2 weighted, plus Re and Im
    terms)."""
    need_complex_autodiff()
    dev = device(dev_name)
    w = np.random.default_rng(3).standard_normal(getattr(torch.fft, fn)(torch.from_numpy(arr), **kw).shape)

    def loss(y: Any, lib: Any, wt: Any) -> Any:
        if y.is_complex():
            return ((y.abs() ** 2) * wt).sum() + (y.real * wt).sum() - (y.imag * wt).sum()
        return (y * y * wt).sum()

    x = ember.tensor(arr, device=dev, requires_grad=True)
    loss(getattr(ember.fft, fn)(x, **kw), ember, ember.tensor(w.astype(np.float32), device=dev)).backward()
    xt = torch.from_numpy(arr).requires_grad_()
    loss(getattr(torch.fft, fn)(xt, **kw), torch, torch.from_numpy(w.astype(np.float32))).backward()
    close(x.grad, xt.grad, 2e-4)


# -- bad input ---------------------------------------------------------------------------------------------------
def test_bad_input_raises_typed_errors() -> None:
    x = ember.tensor(REAL)
    with pytest.raises(ValueRangeError, match="Invalid normalization mode"):
        ember.fft.fft(x, norm="bogus")
    with pytest.raises(DimError, match="fft.fft: Dimension out of range"):
        ember.fft.fft(x, dim=3)
    with pytest.raises(ValueRangeError, match="Invalid number of data points"):
        ember.fft.fft(x, n=0)
    with pytest.raises(DTypeError, match="rfft: expects a real input"):
        ember.fft.rfft(ember.tensor(CPLX))
    with pytest.raises(DTypeError, match="float16"):
        ember.fft.fft(x.half())
    with pytest.raises(ShapeError, match="same length"):
        ember.fft.fftn(x, s=(2, 3), dim=(0,))
    with pytest.raises(DimError, match="unique"):
        ember.fft.fft2(x, dim=(1, 1))
    with pytest.raises(DTypeError, match="expected a Tensor"):
        ember.fft.fft([1.0, 2.0])  # type: ignore[arg-type]


def test_toy_backend_without_complex_raises_typed_error() -> None:
    toy = device("toy")
    x = ember.tensor(REAL[0, 0], device=toy)
    with pytest.raises(DTypeError, match=r"complex64.*'toy'"):
        ember.fft.rfft(x)
    with pytest.raises(DTypeError, match=r"complex64.*'toy'"):
        ember.tensor([1 + 2j], device=toy)
    close(ember.fft.fftshift(x), torch.fft.fftshift(torch.from_numpy(REAL[0, 0])))  # no complex: runs anywhere


def test_namespace_published_by_plugin() -> None:
    import ember_signal.fft

    assert ember.fft is ember_signal.fft
    assert set(ember.fft.__all__) >= {"fft", "irfftn", "fftshift", "rfftfreq"}
    assert ember.stft.__module__ == "ember_signal.spectral"


def test_host_fallback_without_a_kernel_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend that stores complex numbers but has no kernel runs the default composition (scipy.fft on a host
    copy, copied back): flex with its kernels taken away stands in for one."""
    import ember_signal._ops as ops
    import ember_signal.fft  # noqa: F401 - registers the flex kernels taken away below
    from ember.extension import _clear_resolution

    for op in (ops.c2c, ops.r2c, ops.c2r):
        monkeypatch.delitem(op.kernels, "flex")
    _clear_resolution()
    try:
        x = ember.tensor(REAL, device=device("flex"))
        close(ember.fft.rfft2(x, norm="ortho"), torch.fft.rfft2(torch.from_numpy(REAL), norm="ortho"))
        close(ember.fft.ifft(ember.fft.fft(x), n=5), torch.fft.ifft(torch.fft.fft(torch.from_numpy(REAL)), n=5))
        close(ember.fft.irfft(ember.fft.rfft(x)), torch.fft.irfft(torch.fft.rfft(torch.from_numpy(REAL))))
    finally:
        monkeypatch.undo()
        _clear_resolution()


@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), data=st.data())
@settings(max_examples=15, deadline=None)
def test_rfftn_irfftn_batch_dims_match_torch(shape: list[int], data: Any) -> None:
    """Random batch dims and transformed dims (hypothesis): rfftn / irfftn / fftn against torch."""
    ndim = len(shape)
    dims = tuple(sorted(data.draw(st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim))))
    s = tuple(data.draw(st.integers(1, 6)) for _ in dims)
    arr = np.random.default_rng(ndim).standard_normal(shape).astype(np.float32)
    close(ember.fft.rfftn(ember.tensor(arr), s=s, dim=dims), torch.fft.rfftn(torch.from_numpy(arr), s=s, dim=dims))
    close(ember.fft.fftn(ember.tensor(arr), s=s, dim=dims), torch.fft.fftn(torch.from_numpy(arr), s=s, dim=dims))
    spec = torch.fft.rfftn(torch.from_numpy(arr), dim=dims)
    close(ember.fft.irfftn(ember.tensor(spec.numpy()), s=s, dim=dims), torch.fft.irfftn(spec, s=s, dim=dims))
