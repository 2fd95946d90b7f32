"""QLoRA (``apply_qlora``) against a torch reference written here: the 4-bit base weight dequantized (NF4/FP4,
the values ``ember.quantization`` gives back) and LoRA's math, ``x @ Wd.T + b + s · (x @ A.T) @ B.T``; forward and
gradients, float32 and bfloat16 compute, merge, training, adapter files and every refused input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import nn
from ember import quantization as Q
from ember.errors import DTypeError, ValueRangeError
from ember_lora import (
    LoraConfig,
    LoraMultiheadAttention,
    QLoraLinear,
    apply_lora,
    apply_qlora,
    disable_adapters,
    load_adapter,
    merge,
    merge_and_unload,
    save_adapter,
    trainable_parameters,
    unmerge,
)

DEV = ember.device("cpu").autodiff()


def _model(seed: int = 0) -> nn.Sequential:
    ember.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 5)).to(DEV)


def _randomise_b(model: nn.Module, seed: int = 1) -> None:
    """B starts at zero (step 0 is a no-op): give it values so the adapter path is exercised."""
    rng = np.random.default_rng(seed)
    with ember.no_grad():
        for _, m in model.named_modules():
            if isinstance(m, QLoraLinear):
                for name in m.lora_B.keys():
                    w = m.lora_B[name].weight
                    w.copy_(ember.tensor(rng.standard_normal(tuple(w.shape)) * 0.1, dtype=w.dtype, device=DEV))


def _torch_layer(m: QLoraLinear, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    base = m.base_layer
    wd = torch.tensor(base.quantized_weight().dequantize().numpy(), dtype=torch.float64)
    a = torch.tensor(m.lora_A["default"].weight.detach().to(ember.float32).numpy(), dtype=torch.float64,
                     requires_grad=True)
    b = torch.tensor(m.lora_B["default"].weight.detach().to(ember.float32).numpy(), dtype=torch.float64,
                     requires_grad=True)
    bias = torch.tensor(base.bias.detach().to(ember.float32).numpy(), dtype=torch.float64)
    y = x @ wd.T + bias + m.scaling["default"] * (x @ a.T) @ b.T
    return y, {"A": a, "B": b}


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
@pytest.mark.parametrize("double_quant", [True, False], ids=["dq", "no-dq"])
def test_forward_backward_vs_torch(quant: str, double_quant: bool) -> None:
    model = _model()
    apply_qlora(model, LoraConfig(r=4, lora_alpha=8, target_modules=["0"]), quant=quant, double_quant=double_quant)
    layer = model[0]
    assert isinstance(layer, QLoraLinear) and isinstance(layer.base_layer, Q.Linear4bit)
    assert layer.base_layer.quant_type == quant
    _randomise_b(model)
    x = np.random.default_rng(2).standard_normal((6, 64)).astype(np.float32)
    ex = ember.tensor(x, device=DEV, requires_grad=True)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = layer(ex)
    ty, tp = _torch_layer(layer, tx)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    g = np.random.default_rng(3).standard_normal(tuple(y.shape))
    y.backward(ember.tensor(g, dtype=ember.float32, device=DEV))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.lora_A["default"].weight.grad.numpy(), tp["A"].grad.numpy(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(layer.lora_B["default"].weight.grad.numpy(), tp["B"].grad.numpy(), rtol=1e-4,
                               atol=1e-5)
    # gradients only to the adapters: the frozen base has no grad, its 4-bit buffers never get one
    assert layer.base_layer.bias.grad is None
    assert all(b.grad is None for b in layer.base_layer.buffers())
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


def test_bfloat16_compute() -> None:
    model = _model()
    apply_qlora(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"), compute_dtype=ember.bfloat16)
    layer = model[0]
    assert layer.lora_A["default"].weight.dtype is ember.bfloat16
    assert layer.base_layer.bias.dtype is ember.bfloat16 and layer.base_layer.compute_dtype is ember.bfloat16
    _randomise_b(model)
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    y = layer(ember.tensor(x, device=DEV))
    assert y.dtype is ember.float32  # computed in bfloat16, returned in the input's dtype (as bitsandbytes/PEFT)
    assert layer(ember.tensor(x, device=DEV).to(ember.bfloat16)).dtype is ember.bfloat16
    ty, _ = _torch_layer(layer, torch.tensor(x, dtype=torch.float64))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=3e-2, atol=5e-2)
    out = model(ember.tensor(x, device=DEV))
    out.sum().backward()
    assert layer.lora_A["default"].weight.grad.dtype is ember.bfloat16


def test_all_linear_trainable_fraction_and_training() -> None:
    model = _model()
    float_total = sum(p.numel() for p in model.parameters())
    apply_qlora(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", bias="none"))
    # all-linear leaves the output head (the last Linear) alone, as PEFT
    assert [type(model[i]).__name__ for i in (0, 2, 4)] == ["QLoraLinear", "QLoraLinear", "Linear"]
    trainable, total = trainable_parameters(model)
    assert trainable == 4 * (64 + 48) + 4 * (48 + 32)
    assert total == float_total + trainable  # the 4-bit base weights still count as the model's weights
    packed = {n: b.numpy().copy() for n, b in model.named_buffers()}
    x = ember.randn(16, 64, device=DEV)
    target = ember.randint(0, 5, (16,), device=DEV)
    opt = ember.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for n, b in model.named_buffers():  # the quantized base never changes
        assert np.array_equal(b.numpy(), packed[n]), n


def test_merge_dequantizes_and_disable_adapters() -> None:
    model = _model()
    apply_qlora(model, LoraConfig(r=4, lora_alpha=8, target_modules=["0", "2"]))
    _randomise_b(model)
    x = ember.randn(5, 64, device=DEV)
    with ember.no_grad():
        before = model(x).numpy()
        with disable_adapters(model):
            base_only = model(x).numpy()
    assert not np.allclose(before, base_only)
    merge(model)
    layer = model[0]
    assert not layer.quantized and isinstance(layer.base_layer, nn.Linear)
    assert layer.base_layer.weight.dtype is ember.float32 and not layer.base_layer.weight.requires_grad
    with ember.no_grad():
        np.testing.assert_allclose(model(x).numpy(), before, rtol=1e-5, atol=1e-5)
    unmerge(model)
    with ember.no_grad():
        np.testing.assert_allclose(model(x).numpy(), before, rtol=1e-5, atol=1e-5)
    merge_and_unload(model)
    assert type(model[0]) is nn.Linear and type(model[2]) is nn.Linear
    with ember.no_grad():
        np.testing.assert_allclose(model(x).numpy(), before, rtol=1e-5, atol=1e-5)


def test_adapter_files_round_trip(tmp_path: Any) -> None:
    model = _model()
    apply_qlora(model, LoraConfig(r=4, lora_alpha=8, target_modules=["0"]))
    _randomise_b(model)
    x = ember.randn(4, 64, device=DEV)
    with ember.no_grad():
        want = model(x).numpy()
    save_adapter(model, tmp_path)
    other = _model()  # the same base weights (same seed), quantized the same way
    apply_qlora(other, LoraConfig(r=4, lora_alpha=8, target_modules=["0"]))
    load_adapter(other, tmp_path)
    with ember.no_grad():
        np.testing.assert_array_equal(other(x).numpy(), want)


@pytest.mark.parametrize("case", ["conv", "lora-layer", "quant", "compute", "pissa", "blocksize", "dq", "config",
                                  "twice"])
def test_refused_inputs_leave_the_model_unchanged(case: str) -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 4), nn.Linear(4, 4)).to(DEV)
    kw: dict[str, Any] = {}
    config = LoraConfig(r=2, target_modules=["2"])
    err: type = ValueRangeError
    if case == "conv":
        config, err = LoraConfig(r=2, target_modules=["0", "2"]), DTypeError
    elif case == "lora-layer":
        apply_lora(model, LoraConfig(r=2, target_modules=["3"]), adapter="float")
        config, err = LoraConfig(r=2, target_modules=["2", "3"]), DTypeError
    elif case == "quant":
        kw["quant"] = "int4"
    elif case == "compute":
        kw["compute_dtype"], err = ember.float16, DTypeError
    elif case == "pissa":
        config = LoraConfig(r=2, target_modules=["2"], init_lora_weights="pissa")
    elif case == "blocksize":
        kw["blocksize"] = 48
    elif case == "dq":
        kw["double_quant"], err = 1, DTypeError
    elif case == "config":
        config, err = {"r": 2}, DTypeError  # type: ignore[assignment]
    elif case == "twice":
        apply_qlora(model, LoraConfig(r=2, target_modules=["2"]))
    before = [type(m).__name__ for m in model.children()]
    with pytest.raises(err):
        apply_qlora(model, config, **kw)
    assert [type(m).__name__ for m in model.children()] == before
    if case == "twice":
        assert isinstance(model[2], QLoraLinear)
    else:
        assert type(model[2]) is nn.Linear


def test_second_adapter_on_all_linear() -> None:
    model = _model()
    apply_qlora(model, LoraConfig(r=4, target_modules="all-linear"))
    apply_qlora(model, LoraConfig(r=2, target_modules="all-linear"), adapter="second")
    assert model[0].adapter_names == ["default", "second"] and model[2].adapter_names == ["default", "second"]
    assert type(model[4]) is nn.Linear  # the head stays out, as for the first adapter


def test_qlora_linear_refuses_a_float_base() -> None:
    with pytest.raises(DTypeError, match="Linear4bit"):
        QLoraLinear(nn.Linear(2, 2))


def test_seed_transformer_all_linear_adapts_attention_projections_on_float_weights() -> None:
    # "all-linear" under QLoRA: the feed-forward Linears become 4-bit with adapters; the attention projections
    # (MultiheadAttention's packed in_proj_weight and out_proj, read by the module itself) get adapters on their
    # float weights, which stay float and frozen
    ember.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2), nn.Flatten(), nn.Linear(32 * 6, 3)).to(DEV)
    apply_qlora(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    wrapped = sorted(p for p, m in model.named_modules() if isinstance(m, QLoraLinear))
    assert wrapped == [f"0.layers.{i}.linear{j}" for i in range(2) for j in (1, 2)]
    attn = model[0].layers[0].self_attn
    assert isinstance(attn, LoraMultiheadAttention)
    assert attn.projections["default"] == ("q_proj", "k_proj", "v_proj", "out_proj")
    assert attn.base_layer.in_proj_weight.dtype == ember.float32 and not attn.base_layer.in_proj_weight.requires_grad
    x = ember.randn(4, 6, 32, device=DEV)
    loss = model(x).pow(2).mean()
    loss.backward()
    assert model[0].layers[0].linear1.lora_A["default"].weight.grad is not None
    assert attn.lora_A["default"]["q_proj"].weight.grad is not None
    assert attn.lora_B["default"]["out_proj"].weight.grad is not None
    assert attn.base_layer.in_proj_weight.grad is None
