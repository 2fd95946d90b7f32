"""ember_onnx.load: typed errors, initializers as named Parameters, gradients, torch-exported models, backend API."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import ember
import ember_onnx
from ember_onnx.backend import EmberBackend
from ember_onnx.errors import OnnxDTypeError, UnsupportedOnnxOpError


def _mlp_model(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "head.w"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", w1.shape[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", w2.shape[1]])],
        initializer=[numpy_helper.from_array(w1, "fc1.weight"), numpy_helper.from_array(b1, "fc1.bias"),
                     numpy_helper.from_array(w2, "head.w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_unsupported_ops_are_all_listed_at_load() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("ImageDecoder", ["a"], ["b"]),
             helper.make_node("Frobnicate", ["b"], ["c"], domain="com.example"),
             helper.make_node("Frobnicate", ["c"], ["y"], domain="com.example")]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOnnxOpError) as info:
        ember_onnx.load(model)
    assert info.value.ops == ["ai.onnx::ImageDecoder", "com.example::Frobnicate"]
    assert "ImageDecoder" in str(info.value) and "Frobnicate" in str(info.value)
    assert isinstance(info.value, ember.errors.UnsupportedError)


def test_initializers_become_named_parameters_and_gradients_flow(device: ember.Device) -> None:
    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((8, 4), dtype=np.float32), rng.standard_normal(8, dtype=np.float32)
    w2 = rng.standard_normal((8, 3), dtype=np.float32)
    module = ember_onnx.load(_mlp_model(w1, b1, w2), device=device)
    names = dict(module.named_parameters())
    assert sorted(names) == ["fc1.bias", "fc1.weight", "head.w"]
    x = rng.standard_normal((5, 4), dtype=np.float32)
    out = module(ember.tensor(x, device=device))
    tw1, tb1, tw2 = (torch.tensor(a, requires_grad=True) for a in (w1, b1, w2))
    ref = torch.relu(torch.tensor(x) @ tw1.T + tb1) @ tw2
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    if "autodiff" not in str(device):
        return
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(names["fc1.weight"].grad.numpy(), tw1.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(names["head.w"].grad.numpy(), tw2.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_fine_tuning_an_imported_model_lowers_the_loss() -> None:
    dev = ember.Device.parse("flex+autodiff")
    rng = np.random.default_rng(1)
    model = _mlp_model(rng.standard_normal((16, 4), dtype=np.float32), np.zeros(16, np.float32),
                       rng.standard_normal((16, 1), dtype=np.float32))
    module = ember_onnx.load(model, device=dev)
    opt = ember.optim.SGD(module.parameters(), lr=0.01)
    x = ember.tensor(rng.standard_normal((32, 4), dtype=np.float32), device=dev)
    target = ember.tensor(rng.standard_normal((32, 1), dtype=np.float32), device=dev)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = ((module(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_dtype_without_ember_equivalent_is_typed() -> None:
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT32)
    graph = helper.make_graph([node], "cast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT32, [2])])
    module = ember_onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    with pytest.raises(OnnxDTypeError, match="UINT32"):
        module(np.ones(2, np.float32))


def test_function_bodies_and_control_flow_run() -> None:
    # Celu has no handler of its own in some opsets' function form; If runs a subgraph from the outer scope
    then = helper.make_graph([helper.make_node("Celu", ["x"], ["t"], alpha=2.0)], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "if",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    module = ember_onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    ref = torch.nn.functional.celu(torch.tensor(x), alpha=2.0).numpy()
    np.testing.assert_allclose(module(np.array(True), x).numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(module(np.array(False), x).numpy(), -x)


def test_backend_api_runs_a_node_and_a_model() -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    x = np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32)
    (y,) = EmberBackend.run_node(node, [x])
    np.testing.assert_allclose(y, torch.softmax(torch.tensor(x), 1).numpy(), rtol=1e-6, atol=1e-7)
    assert EmberBackend.supports_device("CPU")
    rep = EmberBackend.prepare(_mlp_model(np.eye(4, dtype=np.float32), np.zeros(4, np.float32),
                                          np.ones((4, 1), np.float32)), ember_device="flex")
    (out,) = rep.run([np.ones((3, 4), np.float32)])
    np.testing.assert_allclose(out, np.full((3, 1), 4.0, np.float32))


class _TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 4 * 4, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        y = torch.nn.functional.gelu(self.fc(y.flatten(1)))
        y = self.ln(y).unsqueeze(1).repeat(1, 3, 1)
        a, _ = self.attn(y, y, y)
        return torch.log_softmax(self.out(a.mean(1)), -1)


def test_torch_exported_model_imports_and_matches_torch(device: ember.Device) -> None:
    torch.manual_seed(0)
    net = _TorchNet().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 2.0)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(net, (torch.randn(2, 3, 8, 8),), buf, dynamo=False, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "batch"}}, opset_version=17)
        except Exception as exc:  # noqa: BLE001 - an offline torch without the TorchScript exporter
            pytest.skip(f"torch.onnx.export(dynamo=False) is unavailable: {exc}")
    module = ember_onnx.load(buf.getvalue(), device=device)
    assert "fc.weight" in dict(module.named_parameters())
    for batch in (2, 5):
        x = torch.randn(batch, 3, 8, 8)
        got = module(ember.tensor(x.numpy(), device=device)).numpy()
        np.testing.assert_allclose(got, net(x).detach().numpy(), rtol=1e-4, atol=1e-5)


class _TorchRecurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 6, batch_first=True, bidirectional=True)
        self.gru = torch.nn.GRU(12, 5, batch_first=True, num_layers=2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, _ = self.lstm(x)
        return self.gru(y)


def test_torch_exported_lstm_and_gru_import_and_match_torch() -> None:
    torch.manual_seed(1)
    net = _TorchRecurrent().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(net, (torch.randn(2, 7, 4),), buf, dynamo=False, input_names=["x"],
                              dynamic_axes={"x": {0: "batch", 1: "time"}}, opset_version=17)
        except Exception as exc:  # noqa: BLE001 - an offline torch without the TorchScript exporter
            pytest.skip(f"torch.onnx.export(dynamo=False) is unavailable: {exc}")
    module = ember_onnx.load(buf.getvalue(), device=ember.Device.flex())
    for batch, steps in ((2, 7), (3, 4)):
        x = torch.randn(batch, steps, 4)
        for got, want in zip(module(x.numpy()), net(x)):
            np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_one_imported_module_runs_from_several_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    w1, b1 = rng.standard_normal((8, 4), dtype=np.float32), rng.standard_normal(8, dtype=np.float32)
    w2 = rng.standard_normal((8, 3), dtype=np.float32)
    module = ember_onnx.load(_mlp_model(w1, b1, w2), device=ember.Device.flex())
    xs = [rng.standard_normal((6, 4), dtype=np.float32) for _ in range(8)]

    def run(x: np.ndarray) -> np.ndarray:
        return module(x).numpy()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, xs))
    for x, got in zip(xs, results):
        np.testing.assert_allclose(got, np.maximum(x @ w1.T + b1, 0) @ w2, rtol=1e-5, atol=1e-5)
