"""Each ember.nn layer with an ONNX equivalent exports and matches onnxruntime (two batch sizes where the batch axis
is dynamic; recurrent layers export through their extension's composition, with static shapes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
import ember_onnx
from ember import nn

ort = pytest.importorskip("onnxruntime")

# name -> (layer factory, example input shape or kind)
LAYERS: dict[str, tuple[Callable[[], nn.Module], Any]] = {
    "Conv1d": (lambda: nn.Conv1d(3, 4, 3, padding=1, stride=2), (2, 3, 9)),
    "Conv2d-groups-dilation": (lambda: nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2), (2, 4, 8, 8)),
    "Conv3d": (lambda: nn.Conv3d(2, 3, 2), (1, 2, 4, 4, 4)),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (2, 3, 5, 5)),
    "MaxPool2d-ceil": (lambda: nn.MaxPool2d(3, 2, padding=1, ceil_mode=True), (2, 3, 8, 8)),
    "AvgPool2d": (lambda: nn.AvgPool2d(3, 2, padding=1, count_include_pad=False), (2, 3, 8, 8)),
    "AdaptiveAvgPool2d-1": (lambda: nn.AdaptiveAvgPool2d(1), (2, 3, 8, 8)),
    "AdaptiveAvgPool2d-2": (lambda: nn.AdaptiveAvgPool2d(2), (2, 3, 8, 8)),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(5), (4, 5)),
    "LayerNorm": (lambda: nn.LayerNorm([4, 5]), (2, 3, 4, 5)),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    "InstanceNorm2d": (lambda: nn.InstanceNorm2d(3), (2, 3, 4, 4)),
    "RMSNorm": (lambda: nn.RMSNorm(6), (2, 6)),
    "Embedding": (lambda: nn.Embedding(10, 4), "tokens"),
    "GELU-tanh": (lambda: nn.GELU(approximate="tanh"), (3, 4)),
    "SiLU": (nn.SiLU, (3, 4)),
    "ELU": (nn.ELU, (3, 4)),
    "LeakyReLU": (lambda: nn.LeakyReLU(0.2), (3, 4)),
    "Softplus": (nn.Softplus, (3, 4)),
    "Mish": (nn.Mish, (3, 4)),
    "Hardswish": (nn.Hardswish, (3, 4)),
    "Hardsigmoid": (nn.Hardsigmoid, (3, 4)),
    "Softmax": (lambda: nn.Softmax(-1), (3, 4)),
    "LogSoftmax": (lambda: nn.LogSoftmax(1), (3, 4)),
    "PReLU": (nn.PReLU, (3, 4)),
    "PixelShuffle": (lambda: nn.PixelShuffle(2), (1, 8, 3, 3)),
    "Upsample-nearest": (lambda: nn.Upsample(scale_factor=2), (1, 2, 3, 3)),
    "Upsample-bilinear": (lambda: nn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 3, 3)),
    "Upsample-size-align-corners": (lambda: nn.Upsample(size=(5, 7), mode="bilinear", align_corners=True),
                                    (1, 2, 3, 3)),
    "MultiheadAttention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True), "attention"),
    "TransformerEncoderLayer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), (2, 5, 8)),
    "LSTM": (lambda: nn.LSTM(4, 5, batch_first=True), "recurrent"),
    "GRU": (lambda: nn.GRU(4, 5, batch_first=True), "recurrent"),
    "RNN": (lambda: nn.RNN(4, 5, batch_first=True), "recurrent"),
}


def _example(kind: Any, batch: int) -> ember.Tensor:
    if kind == "tokens":
        return ember.randint(0, 10, (batch, 5))
    if kind == "attention":
        return ember.randn(batch, 5, 8)
    if kind == "recurrent":
        return ember.randn(batch, 6, 4)
    return ember.randn(batch, *kind[1:])


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_matches_onnxruntime(name: str) -> None:
    ember.manual_seed(0)
    factory, kind = LAYERS[name]
    layer = factory().eval()
    if kind == "attention":
        def fn(t: ember.Tensor) -> ember.Tensor:
            return layer(t, t, t)[0]
    elif kind == "recurrent":
        def fn(t: ember.Tensor) -> ember.Tensor:
            return layer(t)[0]
    else:
        fn = layer
    base = 2 if isinstance(kind, str) else kind[0]
    dynamic = kind != "recurrent"
    proto = ember_onnx.export(fn, _example(kind, base), dynamic_axes={"input": {0: "batch"}} if dynamic else None)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in ((base, base + 3) if dynamic else (base,)):
        x = _example(kind, batch)
        (got,) = sess.run(None, {"input": x.numpy()})
        np.testing.assert_allclose(got, fn(x).numpy(), rtol=1e-4, atol=1e-5)
