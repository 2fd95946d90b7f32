"""``ember onnx export`` / ``ember onnx check`` through core's ``ember`` command (the ember.commands entry point)."""

from __future__ import annotations

import pytest

import ember
from ember.cli import main as ember_main
from ember_train.models import seed_cnn


def test_export_then_check_a_saved_seed_cnn(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    pytest.importorskip("onnxruntime")
    weights, out = tmp_path / "cnn.pt", tmp_path / "cnn.onnx"
    ember.manual_seed(0)
    ember.save(seed_cnn().state_dict(), str(weights))
    assert ember_main(["onnx", "export", "--model", "seed-cnn", "--weights", str(weights), "--shape", "2,1,28,28",
                       "--dynamic-batch", "-o", str(out)]) == 0
    assert out.exists()
    assert ember_main(["onnx", "check", str(out), "--device", "flex"]) == 0
    printed = capsys.readouterr().out
    assert "seed-cnn ->" in printed and "(ok)" in printed


def test_check_names_unsupported_ops(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    from onnx import TensorProto, helper, save_model

    graph = helper.make_graph([helper.make_node("ImageDecoder", ["b"], ["y"])], "decode",
                              [helper.make_tensor_value_info("b", TensorProto.UINT8, [16])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 4, 3])])
    path = tmp_path / "decode.onnx"
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    assert ember_main(["onnx", "check", str(path)]) == 1
    assert "ai.onnx::ImageDecoder" in capsys.readouterr().out


def test_unknown_model_factory_is_a_typed_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert ember_main(["onnx", "export", "--model", "nope", "--shape", "1", "-o", "x.onnx"]) != 0
    assert "ValueRangeError" in capsys.readouterr().err
