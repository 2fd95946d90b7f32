"""ember.backend_extension: the custom-op API on every kind of stack (plain, fused, differentiable), its kernel
lookup through the decorator chain, its gradients and its errors. Devices are reached by name; no plugin is
imported."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device, TensorSpec
from ember.extension import backend_extension, unregister

_counter = iter(range(1_000_000))


class Scaled:
    """An op ``scaled_tanh(x, y, alpha) = tanh(x * alpha) + y`` with a counting flex kernel."""

    def __init__(self, *, vjp: bool, fusable: bool = False, kernel: bool = True, method: str | None = None) -> None:
        self.name = f"ext_test_{next(_counter)}.scaled_tanh"
        self.kernel_calls: list[tuple[str, ...]] = []
        self.vjp_calls = 0

        @backend_extension(self.name, fusable=fusable, method=method,
                           output=lambda x, y, alpha=1.0: TensorSpec(ember.broadcast_shapes(x.shape, y.shape),
                                                                     x.dtype))
        def op(x: ember.Tensor, y: ember.Tensor, alpha: float = 1.0) -> ember.Tensor:
            """tanh(x * alpha) + y"""
            return ember.tanh(x * alpha) + y

        if kernel:
            @op.kernel("flex")
            def _(backend: Any, x: Any, y: Any, alpha: float = 1.0) -> Any:
                self.kernel_calls.append((type(backend).__name__, type(x).__name__, type(y).__name__))
                return (np.tanh(x * alpha) + y).astype(x.dtype)

        if vjp:
            @op.vjp
            def _(ctx: Any, grad: ember.Tensor) -> tuple[Any, ...]:
                self.vjp_calls += 1
                x, y, *rest = ctx.inputs
                alpha = rest[0] if rest else ctx.kwargs.get("alpha", 1.0)
                t = ctx.saved_tanh
                return grad * (1 - t * t) * alpha, grad, None

            @op.save
            def _(ctx: Any, inputs: tuple[Any, ...], outputs: tuple[Any, ...]) -> None:
                x = inputs[0]
                alpha = inputs[2] if len(inputs) > 2 else ctx.kwargs.get("alpha", 1.0)
                ctx.saved_tanh = ember.tanh(x * alpha)

        self.op = op


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[Scaled] = []

    def build(**kw: Any) -> Scaled:
        s = Scaled(**kw)
        made.append(s)
        return s

    yield build
    for s in made:
        unregister(s.name)


def _data(dev: Device, requires_grad: bool = False) -> tuple[ember.Tensor, ember.Tensor, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    xn = rng.standard_normal((3, 4)).astype(np.float32)
    yn = rng.standard_normal((4,)).astype(np.float32)
    x = ember.tensor(xn, device=dev, requires_grad=requires_grad)
    y = ember.tensor(yn, device=dev, requires_grad=requires_grad)
    return x, y, xn, yn


DEVICES = ["flex", "flex+fusion(False)", "flex+autodiff", "toy"]


@pytest.mark.parametrize("spec", DEVICES)
def test_the_op_runs_on_every_device(make: Any, spec: str) -> None:
    s = make(vjp=True)
    x, y, xn, yn = _data(Device.parse(spec))
    out = s.op(x, y, alpha=0.5)
    np.testing.assert_allclose(out.numpy(), np.tanh(xn * 0.5) + yn, rtol=1e-6, atol=1e-6)
    assert out.shape == (3, 4) and out.dtype == ember.float32 and out.device == x.device
    # the backend's kernel runs where flex is at the bottom of the stack, the composition on toy
    assert len(s.kernel_calls) == (0 if spec == "toy" else 1)


def test_the_kernel_is_found_through_the_autodiff_decorator(make: Any) -> None:
    """Regression: extension kernels were looked up by the stack's name (flex+fusion+autodiff), so a backend's
    kernel never ran on a differentiable device, not even under no_grad."""
    s = make(vjp=False)
    x, y, *_ = _data(Device.parse("flex+autodiff"))
    s.op(x, y)
    with ember.no_grad():
        s.op(x, y)
    assert [c[0] for c in s.kernel_calls] == ["FlexBackend", "FlexBackend"]
    assert all(c[1] == "ndarray" for c in s.kernel_calls)  # the backend's own handles


def test_on_a_fused_device_the_kernel_is_a_boundary_on_computed_inputs(make: Any) -> None:
    s = make(vjp=False)
    dev = Device.parse("flex")
    x, y, xn, yn = _data(dev)
    pending = x * 2  # recorded, not computed: the boundary computes it first
    out = s.op(pending, y)
    assert s.kernel_calls == [("FlexBackend", "ndarray", "ndarray")]
    np.testing.assert_allclose(out.numpy(), np.tanh(xn * 2) + yn, rtol=1e-6)


def test_a_fusable_op_records_its_composition_on_a_fused_device(make: Any) -> None:
    s = make(vjp=False, fusable=True)
    x, y, xn, yn = _data(Device.parse("flex+fusion"))
    out = s.op(x, y)
    assert s.kernel_calls == []
    np.testing.assert_allclose(out.numpy(), np.tanh(xn) + yn, rtol=1e-6)
    s.op(*_data(Device.parse("flex+fusion(False)"))[:2])  # nothing records lazily there: the kernel runs
    assert len(s.kernel_calls) == 1


def _torch_grads(xn: np.ndarray, yn: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xt = torch.tensor(xn, requires_grad=True)
    yt = torch.tensor(yn, requires_grad=True)
    out = torch.tanh(xt * alpha) + yt
    (out * out).sum().backward()
    return out.detach().numpy(), xt.grad.numpy(), yt.grad.numpy()  # type: ignore[union-attr]


@pytest.mark.parametrize("with_vjp", [True, False], ids=["vjp", "composition"])
def test_gradients_match_pytorch(make: Any, with_vjp: bool) -> None:
    s = make(vjp=with_vjp)
    x, y, xn, yn = _data(Device.parse("flex+autodiff"), requires_grad=True)
    out = s.op(x, y, 0.7)
    (out * out).sum().backward()
    ref, gx, gy = _torch_grads(xn, yn, 0.7)
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.grad.numpy(), gy, rtol=1e-5, atol=1e-5)
    if with_vjp:  # one node: the kernel ran forward and the vjp backward
        assert (len(s.kernel_calls), s.vjp_calls) == (1, 1)
    else:  # the composition was recorded and differentiated; the kernel never ran
        assert (len(s.kernel_calls), s.vjp_calls) == (0, 0)
    assert out.grad_fn is not None


def test_gradients_through_the_composition_on_a_backend_without_kernel(make: Any) -> None:
    s = make(vjp=True)
    x, y, xn, yn = _data(Device.parse("toy+autodiff"), requires_grad=True)
    out = s.op(x, y, 0.7)
    (out * out).sum().backward()
    _, gx, gy = _torch_grads(xn, yn, 0.7)
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.grad.numpy(), gy, rtol=1e-5, atol=1e-5)


def test_output_spec_describes_without_running(make: Any) -> None:
    s = make(vjp=False)
    spec = s.op.output_spec(TensorSpec((5, 1, 3), ember.float64), TensorSpec((2, 3), ember.float64))
    assert spec == TensorSpec((5, 2, 3), ember.float64)
    assert s.kernel_calls == []


def test_published_as_namespace_function_and_tensor_method(make: Any) -> None:
    s = make(vjp=False, method=f"scaled_tanh_{next(_counter)}")
    ns, fn = s.name.split(".")
    assert getattr(getattr(ember, ns), fn) is s.op
    assert ember.dispatch.call(s.name, *_data(Device.parse("flex"))[:2]) is not None
    x, y, xn, yn = _data(Device.parse("flex"))
    method = next(k for k, v in vars(ember.Tensor).items() if getattr(v, "__wrapped__", None) is s.op)
    np.testing.assert_allclose(getattr(x, method)(y).numpy(), np.tanh(xn) + yn, rtol=1e-6)
    unregister(s.name)
    assert not hasattr(getattr(ember, ns), fn) and not hasattr(ember.Tensor, method)
    s.name = f"{ns}.gone"  # the fixture's unregister must not fail
    backend_extension(s.name, output=None)(lambda x: x)


def test_many_threads_share_one_op(make: Any) -> None:
    s = make(vjp=False)
    dev = Device.parse("flex")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(50):
                xn = rng.standard_normal((8,)).astype(np.float32)
                x = ember.tensor(xn, device=dev)
                out = s.op(x * 1.0, x)
                np.testing.assert_allclose(out.numpy(), np.tanh(xn) + xn, rtol=1e-6)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(s.kernel_calls) == 200


# ----------------------------------------------------------------------------------------------------------------
# bad input and bad extensions: typed errors naming the op
# ----------------------------------------------------------------------------------------------------------------
def test_bad_calls(make: Any) -> None:
    s = make(vjp=False)
    x, y, *_ = _data(Device.parse("flex"))
    with pytest.raises(ember.DTypeError, match="scaled_tanh.*at least one Tensor"):
        s.op(1.0, 2.0)
    other = ember.tensor([1.0], device=Device.parse("flex+fusion(False)"))
    with pytest.raises(ember.DeviceError, match="scaled_tanh.*same device"):
        s.op(x, other)
    with pytest.raises(ember.ShapeError, match=r"scaled_tanh: the output spec failed .*\(3, 4\).*\(5,\)"):
        s.op(x, ember.ones(5, device=x.device))


def test_debug_mode_checks_kernel_outputs_against_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"ext_test_{next(_counter)}.wrong"

    @backend_extension(name, output=lambda x: TensorSpec(x.shape, x.dtype))
    def op(x: ember.Tensor) -> ember.Tensor:
        return x.sum()  # wrong: a 0-d result

    @op.kernel("flex")
    def _(backend: Any, x: Any) -> Any:
        return x.reshape(-1)[:1].copy()  # wrong shape

    try:
        x = ember.ones(2, 3, device=Device.parse("flex+fusion(False)"))
        assert op(x).shape == (1,)  # not checked outside debug mode
        monkeypatch.setenv("EMBER_DEBUG", "1")
        with pytest.raises(ember.ShapeError, match=r"wrong: the 'flex' kernel returned output 0 of shape \(1,\)"
                                                   r".*spec says \(2, 3\)"):
            op(x)
        with pytest.raises(ember.ShapeError, match=r"wrong: the composition returned output 0 of shape \(\)"):
            op(ember.ones(2, 3, device=Device.parse("toy")))
    finally:
        unregister(name)


def test_bad_vjp_results(make: Any) -> None:
    name = f"ext_test_{next(_counter)}.badvjp"

    @backend_extension(name, output=lambda x, y: TensorSpec(x.shape, x.dtype))
    def op(x: ember.Tensor, y: ember.Tensor) -> ember.Tensor:
        return x * y

    try:
        dev = Device.parse("flex+autodiff")
        x = ember.ones(3, device=dev, requires_grad=True)
        y = ember.ones(3, device=dev)

        @op.kernel("flex")
        def _(backend: Any, x: Any, y: Any) -> Any:
            return x * y

        @op.vjp
        def _(ctx: Any, grad: Any) -> Any:
            return (grad,)  # one gradient for two inputs

        with pytest.raises(ember.PluginError, match="badvjp: the vjp returned 1 gradients for 2 inputs"):
            op(x, y).sum().backward()

        @op.vjp
        def _(ctx: Any, grad: Any) -> Any:
            return grad.sum(), None

        with pytest.raises(ember.ShapeError, match=r"badvjp: the vjp's gradient for argument 0 has shape \(\)"):
            op(x, y).sum().backward()
    finally:
        unregister(name)


def test_bad_registrations() -> None:
    with pytest.raises(ember.PluginError, match="dotted Python identifier"):
        backend_extension("not a name", output=None)
    with pytest.raises(ember.PluginError, match="output= must be a function"):
        backend_extension("ext_test.x", output=3)  # type: ignore[arg-type]
    with pytest.raises(ember.PluginError, match=r"ember.linalg.vector_norm already exists"):
        backend_extension("linalg.vector_norm", output=None)(lambda x: x)
    with pytest.raises(ember.PluginError, match=r"Tensor.sum already exists"):
        backend_extension(f"ext_test_{next(_counter)}.mysum", output=None, method="sum")(lambda x: x)
    name = f"ext_test_{next(_counter)}.twice"
    def first(x: Any) -> Any:
        return x

    def second(x: Any) -> Any:
        return x + 1

    backend_extension(name, output=None)(first)
    try:
        with pytest.raises(ember.PluginError, match="already registered by .*first"):
            backend_extension(name, output=None)(second)
        assert backend_extension(name, output=None)(first).composition is first  # a reloaded module: replaced
    finally:
        unregister(name)
    with pytest.raises(ember.UnsupportedError, match="no extension op named 'nope.nothing'"):
        ember.dispatch.call("nope.nothing", ember.ones(1))


def test_tensor_spec_checks_its_fields() -> None:
    spec = TensorSpec([2, np.int64(3)], "float32")  # type: ignore[arg-type]
    assert (spec.shape, spec.dtype, spec.ndim) == ((2, 3), ember.float32, 2)
    with pytest.raises(ember.ShapeError, match="negative size"):
        TensorSpec((2, -1), ember.float32)
    with pytest.raises(ember.ShapeError, match="sequence of ints"):
        TensorSpec((2.5,), ember.float32)  # type: ignore[arg-type]
    with pytest.raises(ember.DTypeError):
        TensorSpec((2,), "complex1024")  # type: ignore[arg-type]


def test_ember_info_lists_the_op_and_its_kernels(make: Any) -> None:
    s = make(vjp=False)
    (row,) = [o for o in ember.info()["ops"] if o["name"] == s.name]
    assert row["backends"] == ["flex"] and row["description"] == "tanh(x * alpha) + y"
    assert row["plugin"] == __name__


def _two_outputs(outputs: tuple[int, ...] | None) -> Any:
    """``pair(x) = (exp(x), 2x)`` with a flex kernel and a vjp that reads only the first output."""
    name = f"ext_test_{next(_counter)}.pair"

    @backend_extension(name, output=lambda x: (TensorSpec(x.shape, x.dtype), TensorSpec(x.shape, x.dtype)))
    def pair(x: ember.Tensor) -> tuple[ember.Tensor, ember.Tensor]:
        return ember.exp(x), x * 2

    @pair.kernel("flex")
    def _(backend: Any, x: Any) -> Any:
        return np.exp(x), x * 2

    seen: list[tuple[bool, ...]] = []

    def vjp(ctx: Any, ge: ember.Tensor, gd: ember.Tensor) -> tuple[Any, ...]:
        seen.append(tuple(o is not None for o in ctx.outputs))
        return (ge * ctx.outputs[0] + gd * 2,)

    if outputs is None:
        pair.vjp(vjp)
    else:
        pair.vjp(outputs=outputs)(vjp)
    return name, pair, seen


@pytest.mark.parametrize("outputs", [(0,), (-2,)])
def test_a_vjp_that_names_its_outputs_leaves_the_others_free_to_change_in_place(outputs: tuple[int, ...]) -> None:
    name, pair, seen = _two_outputs(outputs)
    try:
        x = ember.tensor([0.5, -1.0], device=Device.parse("flex+autodiff"), requires_grad=True)
        e, d = pair(x)
        d += 1  # not read by the vjp: legal, as for a torch Function that saves only what it names
        (e.sum() + d.sum()).backward()
        np.testing.assert_allclose(x.grad.numpy(), np.exp([0.5, -1.0]) + 2, rtol=1e-6)
        assert seen == [(True, False)]
        e2, _ = pair(x)
        e2 += 1  # read by the vjp: modifying it is the usual in-place error
        with pytest.raises(ember.AutodiffError, match="modified by an in-place operation"):
            e2.sum().backward()
    finally:
        unregister(name)


def test_by_default_every_output_is_kept_and_checked() -> None:
    name, pair, seen = _two_outputs(None)
    try:
        x = ember.tensor([0.5], device=Device.parse("flex+autodiff"), requires_grad=True)
        e, d = pair(x)
        d += 1
        with pytest.raises(ember.AutodiffError, match="modified by an in-place operation"):
            (e.sum() + d.sum()).backward()
    finally:
        unregister(name)
    with pytest.raises(ember.PluginError, match="outputs= must be a sequence of ints"):
        pair.vjp(outputs=("first",))
