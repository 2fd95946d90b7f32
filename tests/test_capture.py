"""ember.capture: a function's ops recorded as ember.ir records without running kernels, replayed on devices.

The seed models come from ember_train; devices are named by string (no plugin is imported). Replays are checked
against eager runs of the same function, and small functions against torch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device, TensorSpec
from ember.capture import CaptureError, ExtensionArgs
from ember.ir import Ref, Scalar
from ember_train.models import seed_cnn, text_transformer

FLEX = "flex"


@pytest.fixture(scope="module")
def cnn() -> Any:
    ember.manual_seed(0)
    m = seed_cnn()
    m.eval()
    return m


def test_seed_cnn_forward_replays_to_the_eager_outputs(cnn: Any) -> None:
    dev = Device.parse(FLEX)
    g = ember.capture(cnn, ember.randn(4, 1, 28, 28, device=dev))
    ops = g.ops()
    assert ops["conv"] == 2 and ops["max_pool"] == 2 and ops["matmul"] == 3
    assert [v.name for v in g.inputs] == ["input0"]
    names = {c.name for c in g.constants}
    assert {"conv1.weight", "conv1.bias", "bn1.running_mean", "bn2.running_var", "fc3.weight"} <= names
    assert g.output_specs == (TensorSpec((4, 10), ember.float32),)
    assert g.reads == () and g.fallbacks == ()
    for seed in (1, 2):
        ember.manual_seed(seed)
        x = ember.randn(4, 1, 28, 28, device=dev)
        np.testing.assert_array_equal(g.replay(x).numpy(), cnn(x).numpy())


def test_capture_needs_no_data_and_runs_no_kernel(cnn: Any) -> None:
    """TensorSpec inputs have no data: a graph that captures from them ran nothing that needed any."""
    g = ember.capture(cnn, TensorSpec((2, 1, 28, 28), ember.float32), device=FLEX)
    assert len(g.records) > 20 and g.reads == ()
    x = ember.randn(2, 1, 28, 28, device=FLEX)
    np.testing.assert_array_equal(g.replay(x).numpy(), cnn(x).numpy())


@pytest.mark.parametrize("replay_on", ["flex+autodiff", "flex+fusion(False)"])
def test_replay_on_other_devices(cnn: Any, replay_on: str) -> None:
    x = ember.randn(3, 1, 28, 28, device=FLEX)
    g = ember.capture(cnn, x)
    out = g.replay(x, device=replay_on)
    assert str(out.device) == str(Device.parse(replay_on))
    np.testing.assert_allclose(out.detach().numpy(), cnn(x).numpy(), rtol=1e-5, atol=1e-6)


def test_replay_on_autodiff_gives_input_gradients_like_torch() -> None:
    w_np = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    w = ember.tensor(w_np, device=FLEX)

    def fn(x: ember.Tensor) -> ember.Tensor:
        return ember.nn.functional.softmax(x @ w, dim=-1)

    x_np = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    g = ember.capture(fn, ember.tensor(x_np, device=FLEX))
    x = ember.tensor(x_np, device="flex+autodiff").requires_grad_()
    out = g.replay(x)
    (out * out).sum().backward()
    xt = torch.tensor(x_np, requires_grad=True)
    ot = torch.softmax(xt @ torch.tensor(w_np), dim=-1)
    (ot * ot).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), ot.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_seed_transformer_replays_and_lists_its_reads() -> None:
    ember.manual_seed(0)
    m = text_transformer("small", num_classes=4)
    m.eval()
    tok = ember.randint(0, 100, (3, 16), device=FLEX)
    g = ember.capture(m, tok)
    assert any("embedding" in r for r in g.reads)  # the index range check read the example tokens
    assert "embedding" in g.ops()
    tok2 = ember.randint(0, 100, (3, 16), device=FLEX)
    np.testing.assert_array_equal(g.replay(tok2).numpy(), m(tok2).numpy())
    with pytest.raises(CaptureError, match="embedding"):
        ember.capture(m, TensorSpec((3, 16), ember.int64), device=FLEX)
    with pytest.raises(CaptureError, match="allow_reads=False"):
        ember.capture(m, tok, allow_reads=False)


def _many_ops(x: ember.Tensor, idx: ember.Tensor) -> tuple[ember.Tensor, ...]:
    F = ember.nn.functional
    w = ember.ones(4, 2, 3, 3, device=x.device) * 0.1
    c = F.conv2d(x, w, stride=2, padding=1, dilation=1)
    ct = F.conv_transpose2d(x, ember.ones(2, 3, 2, 2, device=x.device), stride=2, padding=1, output_padding=1)
    mp, mi = F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, return_indices=True)
    ap = F.avg_pool2d(x, 2, ceil_mode=True)
    aap = F.adaptive_avg_pool2d(x, (3, 2))
    pd = F.pad(x, (1, 2, 0, 3), value=0.5)
    it = F.interpolate(x, size=(5, 4), mode="nearest")
    v, i = x.flatten(1).topk(3, dim=1)
    s, si = x.sort(dim=-1, descending=True)
    cat = ember.cat([x, x * 2], dim=1)
    ga = x.flatten(2).gather(2, idx)
    sel = x.index_select(3, idx[0, 0])
    es = ember.einsum("nchw,nchw->nc", x, x)
    am = x.argmax(dim=1)
    cs = x.cumsum(dim=2)
    gi = x[:, 1, idx[0, 0], 1:3]
    mask = x > 0
    lt = x.tril(diagonal=-1)
    return c, ct, mp, mi, ap, aap, pd, it, v, i, s, si, cat, ga, sel, es, am, cs, gi, mask, lt


def test_shape_rules_match_the_eager_shapes_and_replay_matches() -> None:
    rng = np.random.default_rng(3)
    x = ember.tensor(rng.standard_normal((2, 2, 7, 6)).astype(np.float32), device=FLEX)
    idx = ember.tensor(rng.integers(0, 6, (2, 2, 5)), device=FLEX)
    g = ember.capture(_many_ops, x, idx)
    eager = _many_ops(x, idx)
    assert g.fallbacks == ()
    hash(g.relative_form()[0])  # slices in getitem keys included
    assert [tuple(s.shape) for s in g.output_specs] == [tuple(t.shape) for t in eager]
    assert [s.dtype for s in g.output_specs] == [t.dtype for t in eager]
    replayed = g.replay(x, idx)
    assert isinstance(replayed, tuple) and len(replayed) == len(eager)
    for r, e in zip(replayed, eager):
        np.testing.assert_allclose(r.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


def test_records_are_plain_ir_data() -> None:
    def fn(x: ember.Tensor, y: ember.Tensor) -> dict[str, Any]:
        return {"sum": (x * 0.5 + y).sum(dim=0), "n": 3}

    g = ember.capture(fn, ember.ones(4, 3, device=FLEX), ember.ones(3, device=FLEX))
    mul = next(r for r in g.records if r.args[:1] == ("mul",))
    assert mul.op == "binary" and mul.args == ("mul", Ref(0), Scalar(0.5)) and mul.inputs == (g.inputs[0].id,)
    assert mul.shapes == ((4, 3),) and mul.dtypes == (ember.float32,)
    out = g.replay(ember.full((4, 3), 2.0, device=FLEX), ember.ones(3, device=FLEX))
    assert out["n"] == 3
    np.testing.assert_array_equal(out["sum"].numpy(), np.full(3, 8.0, np.float32))
    hash(g.relative_form()[0])
    assert "binary('mul'" in g.describe()


def test_relative_form_abstracts_scalar_operands() -> None:
    def scaled(k: float) -> Any:
        return lambda x: (x * k).exp()

    x = ember.ones(5, device=FLEX)
    k1, b1 = ember.capture(scaled(2.0), x).relative_form()
    k2, b2 = ember.capture(scaled(3.0), x).relative_form()
    assert k1 == k2 and b1.scalars == (2.0,) and b2.scalars == (3.0,)


@pytest.fixture
def ext_op() -> Iterator[Any]:
    base = Device.parse(FLEX).stack.base_backend.name

    @ember.backend_extension("capturetest.scale_add", output=lambda x, y, alpha=1.0: TensorSpec(x.shape, x.dtype))
    def op(x: ember.Tensor, y: ember.Tensor, alpha: float = 1.0) -> ember.Tensor:
        return x * alpha + y

    @op.kernel(base)
    def _(backend: Any, x: Any, y: Any, alpha: float = 1.0) -> Any:
        return backend.binary("add", backend.binary("mul", x, alpha), y)

    yield op
    ember.extension.unregister("capturetest.scale_add")


def test_an_extension_op_is_one_record_with_its_name_and_arguments(ext_op: Any) -> None:
    def fn(x: ember.Tensor, y: ember.Tensor) -> ember.Tensor:
        return ext_op(x, y, alpha=3.0).relu()

    x, y = ember.randn(2, 3, device=FLEX), ember.randn(2, 3, device=FLEX)
    g = ember.capture(fn, x, y)
    ext = [r for r in g.records if r.op == "extension"]
    assert len(ext) == 1
    assert ext[0].args == (ExtensionArgs("capturetest.scale_add", (Ref(0), Ref(1)), (("alpha", 3.0),)),)
    assert g.ops()["capturetest.scale_add"] == 1
    x2, y2 = ember.randn(2, 3, device=FLEX), ember.randn(2, 3, device=FLEX)
    np.testing.assert_allclose(g.replay(x2, y2).numpy(), np.maximum(3 * x2.numpy() + y2.numpy(), 0), rtol=1e-6)


def test_in_place_writes_are_versioned_records() -> None:
    def fn(x: ember.Tensor) -> ember.Tensor:
        y = x * 2
        y.add_(1)
        y[0] = 0.0
        return y

    x = ember.ones(3, 2, device=FLEX)
    g = ember.capture(fn, x)
    assert [r.op for r in g.records if r.op in ("inplace_binary", "setitem")] == ["inplace_binary", "setitem"]
    np.testing.assert_array_equal(x.numpy(), np.ones((3, 2), np.float32))  # capture changed nothing
    out = g.replay(ember.full((3, 2), 2.0, device=FLEX)).numpy()
    np.testing.assert_array_equal(out, [[0, 0], [5, 5], [5, 5]])


def test_in_place_into_a_constant_or_a_view_is_refused() -> None:
    ember.manual_seed(0)
    bn = ember.nn.BatchNorm1d(3)  # training mode: updates its running statistics in place
    with pytest.raises(CaptureError, match="num_batches_tracked|running_mean"):
        ember.capture(bn, ember.randn(4, 3, device=FLEX))

    def through_view(x: ember.Tensor) -> ember.Tensor:
        y = x * 1
        y[0].mul_(2)
        return y

    with pytest.raises(CaptureError, match="view"):
        ember.capture(through_view, ember.ones(2, 2, device=FLEX))


def test_item_reads_the_example_data() -> None:
    def fn(x: ember.Tensor) -> ember.Tensor:
        return x / x.sum().item()

    x = ember.tensor([1.0, 3.0], device=FLEX)
    g = ember.capture(fn, x)
    assert len(g.reads) == 1
    np.testing.assert_allclose(g.replay(x).numpy(), [0.25, 0.75])


def test_a_symbolic_handle_refuses_to_become_an_array() -> None:
    """A tensor kept from inside a captured function holds a SymbolicHandle: host code converting it fails
    with a CaptureError instead of producing an object array."""
    kept: list[ember.Tensor] = []

    def fn(x: ember.Tensor) -> ember.Tensor:
        y = x + 1
        kept.append(y)
        return y

    ember.capture(fn, ember.ones(2, device=FLEX))
    with pytest.raises(CaptureError, match="no data outside"):
        np.asarray(kept[0]._h)


def test_other_threads_use_the_device_normally_during_a_capture() -> None:
    started, done = threading.Event(), threading.Event()
    results: list[np.ndarray] = []

    def worker() -> None:
        started.wait(10)
        a = ember.ones(3, device=FLEX)
        results.append((a + 1).numpy())
        done.set()

    def fn(x: ember.Tensor) -> ember.Tensor:
        started.set()
        assert done.wait(10)  # the other thread ran its ops while this one captured
        return x * 3

    t = threading.Thread(target=worker)
    t.start()
    g = ember.capture(fn, ember.ones(3, device=FLEX))
    t.join()
    np.testing.assert_array_equal(results[0], [2.0, 2.0, 2.0])
    assert [r.op for r in g.records] == ["binary"]
    assert not ember.capture.is_capturing()


def test_bad_calls_are_typed_errors() -> None:
    with pytest.raises(ember.DTypeError, match="callable"):
        ember.capture(3, ember.ones(2))  # type: ignore[arg-type]
    g = ember.capture(lambda x: x + 1, ember.ones(2, device=FLEX))
    with pytest.raises(ember.ShapeError, match=r"captured as \[2\]"):
        g.replay(ember.ones(3, device=FLEX))
    with pytest.raises(CaptureError, match="takes 1 inputs"):
        g.replay()

    def nested(x: ember.Tensor) -> ember.Tensor:
        return ember.capture(lambda y: y, x)  # type: ignore[return-value]

    with pytest.raises(CaptureError, match="nest"):
        ember.capture(nested, ember.ones(2, device=FLEX))


def _available(spec: str) -> bool:
    try:
        Device.parse(spec).stack  # noqa: B018 - resolving it says whether the backend is there
    except ember.EmberError:
        return False
    return True


@pytest.mark.skipif(not _available("opencl"), reason="no OpenCL device")
def test_capture_on_opencl_replays_on_flex(cnn: Any) -> None:
    """Capture works on any device: the graph holds no backend object and replays elsewhere."""
    dev = Device.parse("opencl")
    model = seed_cnn().to(dev).eval()
    x = ember.randn(2, 1, 28, 28, device=dev)
    g = ember.capture(model, x)
    assert g.device is dev and g.ops()["conv"] == 2
    eager = model(x).numpy()
    np.testing.assert_array_equal(g.replay(x).numpy(), eager)
    np.testing.assert_allclose(g.replay(x.to(FLEX)).numpy(), eager, rtol=1e-4, atol=1e-5)
