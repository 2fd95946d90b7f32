"""The seed models: shapes, parameter counts and state_dict keys against torch twins, and numerics in float64."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import ember
from ember import nn
from ember.errors import ShapeError, ValueRangeError
from ember_train.models import TRANSFORMER_CONFIGS, SeedCNN, TextTransformer, seed_cnn, text_transformer

torch = pytest.importorskip("torch")
tnn = torch.nn


def torch_seed_cnn() -> tnn.Module:
    return tnn.Sequential(OrderedDict([
        ("conv1", tnn.Conv2d(1, 64, 3)), ("bn1", tnn.BatchNorm2d(64)), ("relu1", tnn.ReLU()),
        ("pool1", tnn.MaxPool2d(2)),
        ("conv2", tnn.Conv2d(64, 64, 3)), ("bn2", tnn.BatchNorm2d(64)), ("relu2", tnn.ReLU()),
        ("pool2", tnn.MaxPool2d(2)), ("flatten", tnn.Flatten()),
        ("fc1", tnn.Linear(1600, 128)), ("gelu1", tnn.GELU()), ("drop1", tnn.Dropout(0.25)),
        ("fc2", tnn.Linear(128, 128)), ("gelu2", tnn.GELU()), ("drop2", tnn.Dropout(0.25)),
        ("fc3", tnn.Linear(128, 10)),
    ]))


class TorchTextTransformer(tnn.Module):
    def __init__(self, vocab_size, num_classes, d_model, nhead, num_layers, dim_feedforward, max_len, dropout=0.1):
        super().__init__()
        self.token_embedding = tnn.Embedding(vocab_size, d_model)
        self.position_embedding = tnn.Embedding(max_len, d_model)
        self.dropout = tnn.Dropout(dropout)
        layer = tnn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation="gelu",
                                            batch_first=True, norm_first=True)
        self.encoder = tnn.TransformerEncoder(layer, num_layers, norm=tnn.LayerNorm(d_model),
                                              enable_nested_tensor=False)
        self.head = tnn.Linear(d_model, num_classes)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1])
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(pos))
        return self.head(self.encoder(x)[:, 0])


def copy_to_torch(model: nn.Module, twin: tnn.Module) -> None:
    """ember state_dict -> torch twin by name (asserts the key sets and shapes agree)."""
    sd = model.state_dict()
    tsd = twin.state_dict()
    assert list(sd) == list(tsd)
    with torch.no_grad():
        for k, v in sd.items():
            assert tuple(v.shape) == tuple(tsd[k].shape), k
            tsd[k].copy_(torch.from_numpy(np.array(v.numpy())))  # np.array keeps 0-d (ascontiguousarray would not)


def test_seed_cnn_shapes_and_params_match_torch():
    ember.manual_seed(0)
    m = seed_cnn()
    twin = torch_seed_cnn()
    assert m.num_params() == sum(p.numel() for p in twin.parameters()) == 260554
    assert list(m.state_dict()) == list(twin.state_dict())
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in twin.named_parameters()]
    out = m(ember.randn(3, 1, 28, 28))
    assert out.shape == (3, 10)
    assert out.dtype == ember.float32


def test_seed_cnn_default_init_ranges():
    ember.manual_seed(1)
    m = SeedCNN()
    w = m.fc1.weight.numpy()
    bound = 1.0 / np.sqrt(1600)
    # torch's default Linear init: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.abs(w).max() <= bound + 1e-7 and np.abs(w).max() > 0.9 * bound
    assert np.all(m.bn1.weight.numpy() == 1.0) and np.all(m.bn1.bias.numpy() == 0.0)


def test_seed_cnn_forward_backward_matches_torch_float64():
    ember.manual_seed(0)
    dev = ember.Device.flex().autodiff()
    m = SeedCNN().to(dev).double()
    twin = torch_seed_cnn().double()
    copy_to_torch(m, twin)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 1, 28, 28))
    y = rng.integers(0, 10, 5)
    for train in (False, True):
        m.train(train)
        twin.train(train)
        if train:  # dropout draws differ between libraries: compare the deterministic rest with p=0
            for name in ("drop1", "drop2"):
                getattr(m, name).p = 0.0
                getattr(twin, name).p = 0.0
        m.zero_grad()
        twin.zero_grad()
        out = m(ember.tensor(x, device=dev))
        tout = twin(torch.from_numpy(x))
        np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-10, atol=1e-10)
        loss = nn.functional.cross_entropy(out, ember.tensor(y, device=dev))
        tloss = tnn.functional.cross_entropy(tout, torch.from_numpy(y))
        assert abs(loss.item() - tloss.item()) < 1e-10
        loss.backward()
        tloss.backward()
        tparams = dict(twin.named_parameters())
        for name, p in m.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), tparams[name].grad.numpy(), rtol=1e-8, atol=1e-10,
                                       err_msg=f"{name} (train={train})")
    # train mode updated the running statistics exactly like torch
    tsd = twin.state_dict()
    for key in ("bn1.running_mean", "bn2.running_var", "bn2.num_batches_tracked"):
        np.testing.assert_allclose(m.state_dict()[key].numpy(), tsd[key].numpy(), rtol=1e-10)


def test_seed_cnn_bad_input_names_expected_shape():
    m = SeedCNN()
    with pytest.raises(ShapeError, match=r"SeedCNN: expected input of shape \(N, 1, 28, 28\), got \(2, 784\)"):
        m(ember.zeros(2, 784))
    with pytest.raises(ShapeError, match=r"got \(2, 3, 28, 28\)"):
        m(ember.zeros(2, 3, 28, 28))
    with pytest.raises(ValueRangeError, match="image_size=8 is too small"):
        SeedCNN(image_size=8)


def test_seed_cnn_other_image_size():
    m = SeedCNN(image_size=32, num_classes=3)
    assert m.fc1.in_features == 64 * 6 * 6
    assert m(ember.zeros(2, 1, 32, 32)).shape == (2, 3)


def test_transformer_configs():
    full, small = TRANSFORMER_CONFIGS["full"], TRANSFORMER_CONFIGS["small"]
    assert (full.vocab_size, full.num_layers, full.d_model, full.dim_feedforward, full.nhead, full.max_len) == (
        28996, 6, 512, 2048, 8, 512)
    assert (small.num_layers, small.d_model, small.max_len) == (2, 128, 128)


@pytest.mark.parametrize("config", ["small", "full"])
def test_transformer_params_and_keys_match_torch(config):
    cfg = TRANSFORMER_CONFIGS[config]
    ember.manual_seed(0)
    m = text_transformer(config, num_classes=4)
    twin = TorchTextTransformer(cfg.vocab_size, 4, cfg.d_model, cfg.nhead, cfg.num_layers, cfg.dim_feedforward,
                                cfg.max_len)
    assert m.num_params() == sum(p.numel() for p in twin.parameters())
    assert list(m.state_dict()) == list(twin.state_dict())
    assert len(m.encoder.layers) == cfg.num_layers
    layer = m.encoder.layers[0]
    assert layer.norm_first and layer.self_attn.batch_first


def test_transformer_forward_matches_torch_float64():
    ember.manual_seed(0)
    dev = ember.Device.flex().autodiff()
    m = TextTransformer(vocab_size=50, num_classes=3, d_model=16, nhead=4, num_layers=2, dim_feedforward=32,
                        max_len=12).to(dev).double()
    twin = TorchTextTransformer(50, 3, 16, 4, 2, 32, 12).double()
    copy_to_torch(m, twin)
    m.eval()
    twin.eval()
    tokens = np.random.default_rng(0).integers(0, 50, (3, 10))
    out = m(ember.tensor(tokens, device=dev))
    tout = twin(torch.from_numpy(tokens))
    assert out.shape == (3, 3)
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-9, atol=1e-10)
    out.sum().backward()
    tout.sum().backward()
    tparams = dict(twin.named_parameters())
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[name].grad.numpy(), rtol=1e-7, atol=1e-10, err_msg=name)


def test_transformer_bad_input():
    m = text_transformer("small", num_classes=2, vocab_size=20, max_len=8)
    with pytest.raises(ShapeError, match=r"sequence length 9 exceeds max_len=8"):
        m(ember.zeros(2, 9, dtype=ember.int64))
    with pytest.raises(ShapeError, match=r"expected token ids of shape \(N, L\), got \(4,\)"):
        m(ember.zeros(4, dtype=ember.int64))
    with pytest.raises(ValueRangeError, match="unknown configuration 'medium'"):
        text_transformer("medium")
    with pytest.raises(ValueRangeError, match="not divisible by nhead=3"):
        TextTransformer(10, 2, d_model=16, nhead=3)
