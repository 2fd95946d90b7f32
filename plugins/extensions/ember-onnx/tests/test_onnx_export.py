"""ember_onnx.export: the seed CNN and seed transformer against onnxruntime at two batch sizes (dynamic batch
axis), checker and shape inference, round trip through ember_onnx.load, typed errors."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import ember
import ember_onnx
from ember_onnx.errors import ExportError
from ember_train.models import seed_cnn, text_transformer

ort = pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-4, 1e-5


def _session(proto: onnx.ModelProto) -> object:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _check(proto: onnx.ModelProto) -> None:
    onnx.checker.check_model(proto, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    assert inferred.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def _with_stats(model: ember.nn.Module) -> ember.nn.Module:
    # non-trivial running statistics, so batch norm's eval path is really exercised
    for name, buf in model.named_buffers():
        if name.endswith("running_var"):
            buf.copy_(ember.rand(*buf.shape) + 0.5)
        elif name.endswith("running_mean"):
            buf.copy_(ember.randn(*buf.shape) * 0.1)
    return model


def test_seed_cnn_matches_onnxruntime_at_two_batch_sizes(tmp_path) -> None:  # noqa: ANN001
    ember.manual_seed(0)
    model = _with_stats(seed_cnn())
    path = tmp_path / "cnn.onnx"
    proto = ember_onnx.export(model, ember.randn(4, 1, 28, 28), path, dynamic_axes={"input": {0: "batch"}})
    _check(proto)
    assert path.exists() and onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.training  # the export ran in eval mode and restored the mode
    assert {i.name for i in proto.graph.initializer} >= {"conv1.weight", "bn1.running_mean", "fc3.bias"}
    sess = _session(proto)
    model.eval()
    for batch in (3, 17):
        x = ember.randn(batch, 1, 28, 28)
        (got,) = sess.run(None, {"input": x.numpy()})
        np.testing.assert_allclose(got, model(x).numpy(), rtol=RTOL, atol=ATOL)


#: the full configuration (6 layers of width 512 on 512 tokens) takes ~40 s on two cores: nox core_onnx runs it
FULL = os.environ.get("EMBER_ONNX_FULL") == "1"


@pytest.mark.parametrize("config, seq", [
    ("small", 32),
    pytest.param("full", 512, marks=pytest.mark.skipif(not FULL, reason="set EMBER_ONNX_FULL=1 (nox core_onnx)")),
])
def test_seed_transformer_matches_onnxruntime_at_two_batch_sizes(config: str, seq: int) -> None:
    ember.manual_seed(1)
    model = text_transformer(config)
    proto = ember_onnx.export(model, ember.randint(0, 28996, (2, seq)), dynamic_axes={"input": {0: "batch"}})
    _check(proto)
    ops = {n.op_type for n in proto.graph.node}
    assert {"LayerNormalization", "Softmax", "Erf", "Gather"} <= ops
    sess = _session(proto)
    model.eval()
    for batch in (1, 3):
        tokens = ember.randint(0, 28996, (batch, seq))
        (got,) = sess.run(None, {"input": tokens.numpy()})
        np.testing.assert_allclose(got, model(tokens).numpy(), rtol=RTOL, atol=ATOL)


def test_dynamic_batch_and_sequence_axes() -> None:
    model = text_transformer("small").eval()
    proto = ember_onnx.export(model, ember.randint(0, 28996, (2, 16)),
                              dynamic_axes={"input": {0: "batch", 1: "seq"}})
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch", "seq"]
    sess = _session(proto)
    for batch, seq in ((1, 5), (4, 40)):
        tokens = ember.randint(0, 28996, (batch, seq))
        (got,) = sess.run(None, {"input": tokens.numpy()})
        np.testing.assert_allclose(got, model(tokens).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [17, 20])
def test_round_trip_export_import_gives_the_same_outputs(opset: int) -> None:
    ember.manual_seed(2)
    model = _with_stats(seed_cnn()).eval()
    proto = ember_onnx.export(model, ember.randn(2, 1, 28, 28), opset=opset, dynamic_axes={"input": [0]})
    assert ("Gelu" in {n.op_type for n in proto.graph.node}) == (opset >= 20)
    back = ember_onnx.load(proto)
    assert set(dict(back.named_parameters())) >= {"conv1.weight", "fc1.weight"}
    x = ember.randn(5, 1, 28, 28)
    np.testing.assert_allclose(back(x).numpy(), model(x).numpy(), rtol=RTOL, atol=ATOL)


def test_functions_with_several_outputs_and_names() -> None:
    def fn(a: ember.Tensor, b: ember.Tensor) -> tuple[ember.Tensor, ember.Tensor]:
        return ember.nn.functional.softmax(a @ b, -1), ember.where(a > 0, a, a * 0.1).sum(dim=0)

    a, b = ember.randn(3, 4), ember.randn(4, 5)
    proto = ember_onnx.export(fn, (a, b), input_names=["a", "b"], output_names=["p", "s"])
    got = _session(proto).run(None, {"a": a.numpy(), "b": b.numpy()})
    want = fn(a, b)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=ATOL)


def test_typed_errors() -> None:
    with pytest.raises(ember.errors.ValueRangeError, match="opset 9"):
        ember_onnx.export(lambda x: x + 1, ember.randn(2), opset=9)
    with pytest.raises(ember.errors.ShapeError, match="input_names"):
        ember_onnx.export(lambda x: x + 1, ember.randn(2), input_names=["a", "b"])
    with pytest.raises(ExportError, match="max_pool with return_indices"):
        ember_onnx.export(lambda x: ember.nn.functional.max_pool2d(x, 2, return_indices=True)[1].float(),
                          ember.randn(1, 1, 4, 4))


def test_extension_without_rule_exports_through_its_composition() -> None:
    # nn.LSTM runs as the nn.rnn_layer extension op, which has no ONNX rule: its composition is lowered in place
    ember.manual_seed(3)
    lstm = ember.nn.LSTM(4, 6, batch_first=True)
    x = ember.randn(2, 5, 4)
    proto = ember_onnx.export(lambda t: lstm(t)[0], x)
    (got,) = _session(proto).run(None, {"input": x.numpy()})
    np.testing.assert_allclose(got, lstm(x)[0].numpy(), rtol=RTOL, atol=ATOL)
    with pytest.raises(ExportError, match="nn.rnn_layer"):
        ember_onnx.export(lambda t: lstm(t)[0], x, dynamic_axes={"input": [0]})


def test_dtype_casts_the_export_only() -> None:
    ember.manual_seed(4)
    model = ember.nn.Sequential(ember.nn.Linear(4, 8), ember.nn.GELU(), ember.nn.LayerNorm(8), ember.nn.Linear(8, 2))
    x = ember.randn(3, 4)
    proto = ember_onnx.export(model, x, dtype=ember.float16)
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert model[0].weight.dtype == ember.float32  # the model itself is left as it was
    (got,) = _session(proto).run(None, {"input": x.numpy().astype(np.float16)})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), model(x).numpy(), rtol=1e-2, atol=2e-3)
