"""ember-lora against a torch reference LoRA written here (``x @ W.T + s · dropout(x) @ A.T @ B.T``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import ember
from ember import nn
from ember.errors import DTypeError, ValueRangeError
from ember.nn import ParamGroup
from ember.records import CorruptRecordError, IncompatibleStateError, RecordNotFoundError
from ember_lora import (
    LoraConfig,
    LoraConv2d,
    LoraEmbedding,
    LoraLinear,
    ModulesToSaveWrapper,
    active_adapter,
    apply_lora,
    delete_adapter,
    disable_adapters,
    load_adapter,
    lora_param_groups,
    merge,
    merge_and_unload,
    print_trainable_parameters,
    save_adapter,
    set_adapter,
    trainable_parameters,
    unload,
    unmerge,
)

DEV = ember.device("cpu").autodiff()


def t(x: ember.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.array(x.detach().numpy(), dtype=np.float64))


def e(a: np.ndarray | torch.Tensor, dtype: object = ember.float32) -> ember.Tensor:
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else a
    return ember.tensor(np.asarray(a), dtype=dtype, device=DEV)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.fc2 = nn.Linear(12, 12)
        self.head = nn.Linear(12, 3)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        return self.head(self.fc2(self.fc1(x).relu()).relu())


class Mixed(nn.Module):
    """An embedding, a convolution and linear layers: every wrapped layer type in one model."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8, padding_idx=0)
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, idx: ember.Tensor, img: ember.Tensor) -> ember.Tensor:
        a = self.proj(self.emb(idx)).mean(1)
        b = self.conv(img).mean((2, 3)).sum(1, keepdim=True)
        return self.head(a + b)


def _mlp(seed: int = 0) -> MLP:
    ember.manual_seed(seed)
    return MLP().to(DEV)


def _randomise(model: nn.Module, seed: int = 1) -> None:
    """Give every adapter weight a random value (B starts at zero, which hides bugs)."""
    rng = np.random.default_rng(seed)
    with ember.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(e(rng.normal(0, 0.3, p.shape)))


# -- forward and gradients of each layer type against torch ------------------------------------------------------
@pytest.mark.parametrize("rslora", [False, True], ids=["alpha/r", "rslora"])
def test_linear_forward_and_grad_match_torch(rslora: bool) -> None:
    ember.manual_seed(0)
    base = nn.Linear(5, 7).to(DEV)
    model = nn.Sequential(base)
    apply_lora(model, LoraConfig(r=3, lora_alpha=6, target_modules=["0"], use_rslora=rslora))
    layer = model[0]
    assert isinstance(layer, LoraLinear) and layer.base_layer is base
    _randomise(model)
    s = 6 / (math.sqrt(3) if rslora else 3)
    assert layer.scaling["default"] == pytest.approx(s)
    x_np = np.random.default_rng(2).normal(size=(4, 5))
    x = e(x_np)
    y = layer(x)
    y.sum().backward()
    w, b = t(base.weight), t(base.bias)
    a_t = t(layer.lora_A["default"].weight).requires_grad_(True)
    b_t = t(layer.lora_B["default"].weight).requires_grad_(True)
    xt = torch.from_numpy(x_np)
    ref = xt @ w.T + b + s * (xt @ a_t.T @ b_t.T)
    ref.sum().backward()
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.lora_A["default"].weight.grad.numpy(), a_t.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.lora_B["default"].weight.grad.numpy(), b_t.grad.numpy(), rtol=1e-4, atol=1e-5)
    # the frozen base gets no gradient at all: nothing is computed or stored for it
    assert not base.weight.requires_grad and base.weight.grad is None
    assert not base.bias.requires_grad and base.bias.grad is None


def test_conv2d_forward_and_grad_match_torch() -> None:
    ember.manual_seed(0)
    base = nn.Conv2d(3, 5, 3, stride=2, padding=1, dilation=1).to(DEV)
    model = nn.Sequential(base)
    apply_lora(model, LoraConfig(r=2, lora_alpha=4, target_modules="0"))
    layer = model[0]
    assert isinstance(layer, LoraConv2d)
    _randomise(model)
    x_np = np.random.default_rng(3).normal(size=(2, 3, 7, 7))
    y = layer(e(x_np))
    (y * y).sum().backward()
    a_t = t(layer.lora_A["default"].weight).requires_grad_(True)
    b_t = t(layer.lora_B["default"].weight).requires_grad_(True)
    xt = torch.from_numpy(x_np)
    ref = torch.nn.functional.conv2d(xt, t(base.weight), t(base.bias), stride=2, padding=1) + 2.0 * \
        torch.nn.functional.conv2d(torch.nn.functional.conv2d(xt, a_t, stride=2, padding=1), b_t)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.lora_A["default"].weight.grad.numpy(), a_t.grad.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(layer.lora_B["default"].weight.grad.numpy(), b_t.grad.numpy(), rtol=1e-3, atol=1e-3)
    assert base.weight.grad is None


def test_embedding_forward_and_grad_match_torch() -> None:
    ember.manual_seed(0)
    base = nn.Embedding(9, 4, padding_idx=1).to(DEV)
    model = nn.Sequential(base)
    apply_lora(model, LoraConfig(r=2, lora_alpha=2, target_modules=["0"]))
    layer = model[0]
    assert isinstance(layer, LoraEmbedding)
    # PEFT's embedding init: A zero, B normal (the update is zero at step 0)
    assert float(layer.lora_embedding_A["default"].abs().sum().item()) == 0.0
    assert float(layer.lora_embedding_B["default"].abs().sum().item()) > 0.0
    _randomise(model)
    idx_np = np.array([[0, 1, 3], [8, 1, 2]])
    idx = ember.tensor(idx_np, dtype=ember.int64, device=DEV)
    y = layer(idx)
    y.sum().backward()
    a_t = t(layer.lora_embedding_A["default"]).requires_grad_(True)
    b_t = t(layer.lora_embedding_B["default"]).requires_grad_(True)
    it = torch.from_numpy(idx_np)
    ref = torch.nn.functional.embedding(it, t(base.weight), padding_idx=1) + \
        1.0 * (torch.nn.functional.embedding(it, a_t.T, padding_idx=1) @ b_t.T)
    ref.sum().backward()
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.lora_embedding_A["default"].grad.numpy(), a_t.grad.numpy(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(layer.lora_embedding_B["default"].grad.numpy(), b_t.grad.numpy(), rtol=1e-4,
                               atol=1e-5)


def test_dropout_applies_to_the_adapter_path_only() -> None:
    model = _mlp()
    x = e(np.random.default_rng(0).normal(size=(3, 6)))
    apply_lora(model, LoraConfig(r=2, lora_dropout=1.0, target_modules=["fc1"]))
    _randomise(model)
    fc1 = model.fc1
    base_out = fc1.base_layer(x).numpy()
    np.testing.assert_allclose(fc1(x).numpy(), base_out, rtol=1e-6)  # train mode: the adapter input is all dropped
    model.eval()
    s = fc1.scaling["default"]
    full = base_out + s * (t(x) @ t(fc1.lora_A["default"].weight).T @ t(fc1.lora_B["default"].weight).T).numpy()
    np.testing.assert_allclose(fc1(x).numpy(), full, rtol=1e-5, atol=1e-5)


# -- initialisation ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("init", [True, "gaussian", "pissa"], ids=str)
def test_step_zero_is_a_no_op(init: object) -> None:
    ember.manual_seed(0)
    model = Mixed().to(DEV)
    idx = ember.tensor([[1, 2, 3]], dtype=ember.int64, device=DEV)
    img = e(np.random.default_rng(0).normal(size=(1, 2, 5, 5)))
    before = model(idx, img).numpy()
    apply_lora(model, LoraConfig(r=2, target_modules=["emb", "conv", "proj"], init_lora_weights=init))
    np.testing.assert_allclose(model(idx, img).numpy(), before, rtol=1e-4, atol=1e-5)
    a = model.proj.lora_A["default"].weight.numpy()
    if init is True:  # kaiming-uniform with a=sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        assert np.abs(a).max() <= 1 / math.sqrt(8) + 1e-7
    if init == "gaussian":
        assert 0.1 < a.std() < 0.9  # std 1/r = 0.5
    if init == "pissa":  # A, B carry the top singular directions; the base keeps the residual
        assert np.abs(model.proj.lora_B["default"].weight.numpy()).sum() > 0
        merged = model.proj.base_layer.weight.numpy() + model.proj.get_delta_weight("default").numpy()
        assert np.linalg.matrix_rank(model.proj.get_delta_weight("default").numpy()) == 2
        assert merged.shape == (8, 8)


def test_init_false_starts_changed() -> None:
    model = _mlp()
    x = e(np.ones((1, 6)))
    before = model(x).numpy()
    apply_lora(model, LoraConfig(target_modules=["fc1"], init_lora_weights=False))
    assert not np.allclose(model(x).numpy(), before)


# -- targets ------------------------------------------------------------------------------------------------------
def _wrapped(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, (LoraLinear, LoraConv2d, LoraEmbedding))]


@pytest.mark.parametrize("target,expected", [
    (r"fc\d", ["fc1", "fc2"]),
    ("fc", []),  # a regex must match the whole path
    (["fc2", "head"], ["fc2", "head"]),
    ("all-linear", ["fc1", "fc2"]),  # every Linear but the output head
], ids=["regex", "regex-fullmatch", "list", "all-linear"])
def test_target_selection(target: object, expected: list[str]) -> None:
    model = _mlp()
    if not expected:
        with pytest.raises(ValueRangeError, match="selects no module"):
            apply_lora(model, LoraConfig(target_modules=target))
        assert _wrapped(model) == []
        return
    apply_lora(model, LoraConfig(target_modules=target))
    assert _wrapped(model) == expected


def test_list_targets_match_dotted_suffixes_and_param_group() -> None:
    model = nn.Sequential(_mlp(), _mlp())
    apply_lora(model, LoraConfig(target_modules=["fc2"]))
    assert _wrapped(model) == ["0.fc2", "1.fc2"]
    model = nn.Sequential(_mlp(), _mlp())
    apply_lora(model, LoraConfig(target_modules=ParamGroup(model, regex=r"^1\.fc1\.weight$")))
    assert _wrapped(model) == ["1.fc1"]


def test_all_linear_uses_get_output_embeddings() -> None:
    class WithHead(MLP):
        def get_output_embeddings(self) -> nn.Module:
            return self.fc1

    ember.manual_seed(0)
    model = WithHead().to(DEV)
    apply_lora(model, LoraConfig(target_modules="all-linear"))
    assert _wrapped(model) == ["fc2", "head"]


# -- freezing, bias modes, modules_to_save, parameter counts ---------------------------------------------------
@pytest.mark.parametrize("bias,extra", [
    ("none", []), ("all", ["fc1.base_layer.bias", "fc2.bias", "head.bias"]), ("lora_only", ["fc1.base_layer.bias"]),
], ids=["none", "all", "lora_only"])
def test_bias_modes(bias: str, extra: list[str]) -> None:
    model = _mlp()
    apply_lora(model, LoraConfig(target_modules=["fc1"], bias=bias))
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(["fc1.lora_A.default.weight", "fc1.lora_B.default.weight", *extra])
    # every weight of the base model is frozen whatever the bias mode
    assert not any(p.requires_grad for n, p in model.named_parameters() if n.endswith(("base_layer.weight",
                                                                                      "fc2.weight", "head.weight")))


def test_modules_to_save_and_trainable_report(capsys: pytest.CaptureFixture[str]) -> None:
    model = _mlp()
    apply_lora(model, LoraConfig(r=2, target_modules=["fc1"], modules_to_save=["head"]))
    assert isinstance(model.head, ModulesToSaveWrapper)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == ["fc1.lora_A.default.weight", "fc1.lora_B.default.weight",
                         "head.modules_to_save.default.weight", "head.modules_to_save.default.bias"]
    base_total = 6 * 12 + 12 + 12 * 12 + 12 + 12 * 3 + 3
    lora = 2 * 6 + 12 * 2
    head = 12 * 3 + 3
    assert trainable_parameters(model) == (lora + head, base_total + lora + head)
    print_trainable_parameters(model)
    pct = 100 * (lora + head) / (base_total + lora + head)
    assert capsys.readouterr().out == (f"trainable params: {lora + head:,d} || all params: "
                                       f"{base_total + lora + head:,d} || trainable%: {pct:.4f}\n")
    # the copy trains, the original stays: with adapters disabled the original head runs again
    x = e(np.ones((2, 6)))
    with ember.no_grad():
        model.head.modules_to_save["default"].weight.add_(1.0)
    changed = model(x).numpy()
    with disable_adapters(model):
        plain = model(x).numpy()
    assert not np.allclose(changed, plain)


# -- merge / unmerge / unload ---------------------------------------------------------------------------------
def test_merge_unmerge_and_merge_and_unload_agree() -> None:
    ember.manual_seed(0)
    model = Mixed().to(DEV)
    apply_lora(model, LoraConfig(r=3, lora_alpha=5, target_modules=["emb", "conv", "proj"],
                                 modules_to_save=["head"]))
    _randomise(model)
    idx = ember.tensor([[1, 2, 0, 9]], dtype=ember.int64, device=DEV)
    img = e(np.random.default_rng(0).normal(size=(2, 2, 6, 6)))
    base_w = model.proj.base_layer.weight.numpy().copy()
    out = model(idx, img).numpy()
    merge(model)
    assert model.proj.merged and not np.allclose(model.proj.base_layer.weight.numpy(), base_w)
    np.testing.assert_allclose(model(idx, img).numpy(), out, rtol=1e-4, atol=1e-5)
    unmerge(model)
    np.testing.assert_allclose(model.proj.base_layer.weight.numpy(), base_w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(model(idx, img).numpy(), out, rtol=1e-4, atol=1e-5)
    plain = merge_and_unload(model)
    assert plain is model and type(model.proj) is nn.Linear and type(model.emb) is nn.Embedding
    assert type(model.conv) is nn.Conv2d and type(model.head) is nn.Linear
    assert not any("lora" in n or "modules_to_save" in n for n, _ in model.named_parameters())
    np.testing.assert_allclose(model(idx, img).numpy(), out, rtol=1e-4, atol=1e-5)


def test_disable_adapters_runs_the_base_and_restores_a_merge() -> None:
    model = _mlp()
    x = e(np.random.default_rng(1).normal(size=(2, 6)))
    base = model(x).numpy()
    apply_lora(model, LoraConfig(target_modules=["fc1", "fc2"]))
    _randomise(model)
    adapted = model(x).numpy()
    merge(model)
    with disable_adapters(model):
        np.testing.assert_allclose(model(x).numpy(), base, rtol=1e-5, atol=1e-6)
    assert model.fc1.merged
    np.testing.assert_allclose(model(x).numpy(), adapted, rtol=1e-5, atol=1e-5)
    unload(model)
    assert type(model.fc1) is nn.Linear
    np.testing.assert_allclose(model(x).numpy(), base, rtol=1e-5, atol=1e-6)


# -- several adapters ---------------------------------------------------------------------------------------------
def test_multi_adapter_switching() -> None:
    model = _mlp()
    x = e(np.random.default_rng(4).normal(size=(2, 6)))
    base = model(x).numpy()
    apply_lora(model, LoraConfig(target_modules=["fc1"]))
    apply_lora(model, LoraConfig(r=2, target_modules=["fc1", "fc2"]), adapter="other")
    assert active_adapter(model) == "default"
    assert model.fc1.adapter_names == ["default", "other"] and model.fc2.adapter_names == ["other"]
    _randomise(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"fc1.lora_A.default.weight", "fc1.lora_B.default.weight"}
    out_default = model(x).numpy()
    fc1 = model.fc1
    s = fc1.scaling["default"]
    h = t(x) @ t(fc1.base_layer.weight).T + t(fc1.base_layer.bias) + s * (
        t(x) @ t(fc1.lora_A["default"].weight).T @ t(fc1.lora_B["default"].weight).T)
    ref = torch.relu(torch.relu(h) @ t(model.fc2.base_layer.weight).T + t(model.fc2.base_layer.bias)) @ \
        t(model.head.weight).T + t(model.head.bias)
    np.testing.assert_allclose(out_default, ref.numpy(), rtol=1e-4, atol=1e-5)
    set_adapter(model, "other")
    assert model.fc1.active_adapters == ["other"] and model.fc2.active_adapters == ["other"]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{m}.lora_{ab}.other.weight" for m in ("fc1", "fc2") for ab in "AB"}
    out_other = model(x).numpy()
    assert not np.allclose(out_other, out_default) and not np.allclose(out_other, base)
    set_adapter(model, "default")
    np.testing.assert_allclose(model(x).numpy(), out_default, rtol=1e-6)
    delete_adapter(model, "default")
    assert active_adapter(model) == "other" and model.fc1.adapter_names == ["other"]
    np.testing.assert_allclose(model(x).numpy(), out_other, rtol=1e-6)
    delete_adapter(model, "other")
    assert type(model.fc1) is nn.Linear and type(model.fc2) is nn.Linear
    np.testing.assert_allclose(model(x).numpy(), base, rtol=1e-6)


# -- optimizer groups and a short fine-tune ------------------------------------------------------------------
def test_lora_param_groups() -> None:
    model = _mlp()
    apply_lora(model, LoraConfig(target_modules=["fc1"], bias="all", modules_to_save=["head"]))
    groups = lora_param_groups(model, lr=1e-3, weight_decay=0.01, adapter_lr=1e-2, bias_weight_decay=0.0)
    by = {g["name"]: g for g in groups}
    assert by["adapters"]["lr"] == 1e-2 and by["adapters"]["weight_decay"] == 0.01
    assert by["adapters"]["param_names"] == ["fc1.lora_A.default.weight", "fc1.lora_B.default.weight"]
    assert by["modules_to_save"]["lr"] == 1e-3
    assert by["modules_to_save"]["param_names"] == ["head.modules_to_save.default.weight",
                                                    "head.modules_to_save.default.bias"]
    assert by["biases"]["param_names"] == ["fc1.base_layer.bias", "fc2.bias"] and by["biases"]["weight_decay"] == 0
    opt = ember.optim.AdamW(groups)
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-2, 1e-3]
    with pytest.raises(ValueRangeError, match="adapter_lr"):
        lora_param_groups(model, lr=1e-3, adapter_lr=-1.0)


def test_short_fine_tune_moves_only_adapter_weights() -> None:
    model = _mlp(3)
    rng = np.random.default_rng(0)
    x = e(rng.normal(size=(32, 6)))
    y = e(np.sin(rng.normal(size=(32, 3))))
    apply_lora(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    frozen = {n: p.numpy().copy() for n, p in model.named_parameters() if not p.requires_grad}
    adapters_before = {n: p.numpy().copy() for n, p in model.named_parameters() if p.requires_grad}
    opt = ember.optim.Adam(lora_param_groups(model, lr=0.02))
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    assert losses[-1] < 0.7 * losses[0]
    # gradient memory is the adapters' alone: every stored gradient belongs to a trainable parameter
    grad_elements = sum(p.grad.numel() for p in model.parameters() if p.grad is not None)
    trainable, total = trainable_parameters(model)
    assert grad_elements == trainable == (4 * 6 + 12 * 4) + (4 * 12 + 12 * 4)
    assert total - trainable == sum(v.size for v in frozen.values())
    for n, p in model.named_parameters():
        if n in frozen:
            np.testing.assert_array_equal(p.numpy(), frozen[n], err_msg=n)
            assert p.grad is None, n
    assert all(not np.array_equal(dict(model.named_parameters())[n].numpy(), v)
               for n, v in adapters_before.items() if "lora_B" in n)


# -- save / load -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("peft_format", [False, True], ids=["ember", "peft"])
def test_save_load_round_trip(tmp_path: object, peft_format: bool) -> None:
    ember.manual_seed(0)
    model = Mixed().to(DEV)
    apply_lora(model, LoraConfig(r=2, target_modules=["emb", "conv", "proj"], modules_to_save=["head"],
                                 bias="lora_only"))
    _randomise(model)
    idx = ember.tensor([[1, 2, 3]], dtype=ember.int64, device=DEV)
    img = e(np.random.default_rng(0).normal(size=(1, 2, 5, 5)))
    out = model(idx, img).numpy()
    save_adapter(model, tmp_path, peft_format=peft_format)
    # a fresh copy of the same base model
    ember.manual_seed(0)
    fresh = Mixed().to(DEV)
    load_adapter(fresh, tmp_path, adapter="restored")
    assert active_adapter(fresh) == "restored"
    np.testing.assert_allclose(fresh(idx, img).numpy(), out, rtol=1e-5, atol=1e-6)
    # loading into an existing adapter overwrites it
    with ember.no_grad():
        fresh.proj.lora_A["restored"].weight.zero_()
    load_adapter(fresh, tmp_path, adapter="restored")
    np.testing.assert_allclose(fresh(idx, img).numpy(), out, rtol=1e-5, atol=1e-6)


def test_peft_format_key_names_and_config(tmp_path: object) -> None:
    from safetensors.numpy import load_file

    ember.manual_seed(0)
    model = Mixed().to(DEV)
    apply_lora(model, LoraConfig(r=2, lora_alpha=4, target_modules=["emb", "proj"], modules_to_save=["head"]))
    save_adapter(model, tmp_path, peft_format=True)
    keys = set(load_file(str(tmp_path / "adapter_model.safetensors")))
    assert keys == {
        "base_model.model.emb.lora_embedding_A", "base_model.model.emb.lora_embedding_B",
        "base_model.model.proj.lora_A.weight", "base_model.model.proj.lora_B.weight",
        "base_model.model.head.weight", "base_model.model.head.bias",
    }
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 2 and cfg["lora_alpha"] == 4
    assert cfg["target_modules"] == ["emb", "proj"] and cfg["modules_to_save"] == ["head"]
    assert cfg["use_dora"] is False and cfg["fan_in_fan_out"] is False
    sd = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert sd["base_model.model.proj.lora_A.weight"].shape == (2, 8)
    assert sd["base_model.model.emb.lora_embedding_A"].shape == (2, 10)


def test_load_refuses_a_mismatched_base(tmp_path: object) -> None:
    model = _mlp()
    apply_lora(model, LoraConfig(r=2, target_modules=["fc1", "fc2"]))
    save_adapter(model, tmp_path)

    class Wider(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(6, 12)
            self.fc2 = nn.Linear(12, 20)

    other = Wider().to(DEV)
    with pytest.raises(IncompatibleStateError, match=r"fc2\.lora_B\.weight \(checkpoint \[12, 2\], model \[20, 2\]"):
        load_adapter(other, tmp_path)
    assert type(other.fc1) is nn.Linear and type(other.fc2) is nn.Linear  # left as it was
    nofc2 = nn.Sequential()
    nofc2.fc1 = nn.Linear(6, 12)
    with pytest.raises(IncompatibleStateError, match=r"fc2\.lora_A\.weight"):
        load_adapter(nofc2, tmp_path)
    # another r for an existing adapter
    target = _mlp()
    apply_lora(target, LoraConfig(r=3, target_modules=["fc1", "fc2"]))
    with pytest.raises(IncompatibleStateError, match=r"checkpoint \[2, 6\], model \[3, 6\]"):
        load_adapter(target, tmp_path)


# -- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,error,match", [
    ({"r": 0}, ValueRangeError, "r must be a positive int"),
    ({"r": 2.0}, ValueRangeError, "r must be a positive int"),
    ({"r": True}, ValueRangeError, "r must be a positive int"),
    ({"lora_alpha": -1}, ValueRangeError, "lora_alpha"),
    ({"lora_alpha": float("nan")}, ValueRangeError, "lora_alpha"),
    ({"lora_alpha": 2, "alpha": 3}, ValueRangeError, "not both"),
    ({"lora_dropout": 1.5}, ValueRangeError, "lora_dropout"),
    ({"dropout": "x"}, ValueRangeError, "lora_dropout"),
    ({"target_modules": "fc("}, ValueRangeError, "not a valid regex"),
    ({"target_modules": []}, ValueRangeError, "empty list"),
    ({"target_modules": [1]}, DTypeError, "non-empty strings"),
    ({"target_modules": 3}, DTypeError, "list of module names"),
    ({"bias": "some"}, ValueRangeError, "bias must be one of"),
    ({"modules_to_save": "head"}, DTypeError, "modules_to_save"),
    ({"use_rslora": 1}, DTypeError, "use_rslora"),
    ({"init_lora_weights": "olora"}, ValueRangeError, "init_lora_weights"),
    ({"init_lora_weights": 1}, ValueRangeError, "init_lora_weights"),
], ids=lambda v: str(v) if not isinstance(v, dict) else ",".join(f"{k}={v[k]!r}" for k in v))
def test_config_validation(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        LoraConfig(**kwargs)


def test_config_aliases_and_dict_round_trip() -> None:
    c = LoraConfig(r=4, alpha=16, dropout=0.1, target=["q", "v"], init="gaussian", use_rslora=True)
    assert (c.lora_alpha, c.lora_dropout, c.target_modules, c.init_lora_weights) == (16, 0.1, ("q", "v"), "gaussian")
    assert c.scaling == 16 / 2
    assert LoraConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueRangeError, match="use_dora"):
        LoraConfig.from_dict({**c.to_dict(), "use_dora": True})
    with pytest.raises(ValueRangeError, match="peft_type"):
        LoraConfig.from_dict({"peft_type": "IA3"})


def test_apply_lora_bad_input() -> None:
    model = _mlp()
    with pytest.raises(DTypeError, match="model must be an nn.Module"):
        apply_lora("model", LoraConfig(target_modules=["fc1"]))  # type: ignore[arg-type]
    with pytest.raises(DTypeError, match="config must be"):
        apply_lora(model, {"r": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueRangeError, match="no target_modules"):
        apply_lora(model, LoraConfig())
    with pytest.raises(ValueRangeError, match="adapter name"):
        apply_lora(model, LoraConfig(target_modules=["fc1"]), adapter="a.b")
    with pytest.raises(ValueRangeError, match=r"selects no module of MLP \(its Linear/Conv2d/Embedding layers: "
                                              r"\['fc1', 'fc2', 'head'\]"):
        apply_lora(model, LoraConfig(target_modules=["nope"]))
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with pytest.raises(DTypeError, match="target '1' is a ReLU"):
        apply_lora(seq, LoraConfig(target_modules=r"\d"))
    assert type(seq[0]) is nn.Linear  # refused before anything was wrapped
    with pytest.raises(ValueRangeError, match="both LoRA targets and modules_to_save"):
        apply_lora(model, LoraConfig(target_modules=["fc1"], modules_to_save=["fc1"]))
    with pytest.raises(ValueRangeError, match="modules_to_save"):
        apply_lora(model, LoraConfig(target_modules=["fc1"], modules_to_save=["missing"]))
    with pytest.raises(ValueRangeError, match="different model"):
        apply_lora(model, LoraConfig(target_modules=ParamGroup(_mlp())))
    grouped = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2))
    with pytest.raises(ValueRangeError, match="groups=2"):
        apply_lora(grouped, LoraConfig(target_modules=["0"]))
    with pytest.raises(ValueRangeError, match="max_norm"):
        apply_lora(nn.Sequential(nn.Embedding(4, 2, max_norm=1.0)), LoraConfig(target_modules=["0"]))
    with pytest.raises(ValueRangeError, match="pissa"):
        apply_lora(nn.Sequential(nn.Linear(2, 3)), LoraConfig(r=4, target_modules=["0"], init_lora_weights="pissa"))
    apply_lora(model, LoraConfig(target_modules=["fc1"]))
    with pytest.raises(ValueRangeError, match="already has an adapter named 'default'"):
        apply_lora(model, LoraConfig(target_modules=["fc1"]))


def test_model_functions_bad_input(tmp_path: object) -> None:
    plain = _mlp()
    for fn in (set_adapter, delete_adapter):
        with pytest.raises(ValueRangeError, match="has no LoRA adapters"):
            fn(plain, "default")
    for fn in (merge, unmerge, merge_and_unload, unload, lora_param_groups):
        with pytest.raises(ValueRangeError, match="has no LoRA adapters"):
            fn(plain) if fn is not lora_param_groups else fn(plain, lr=0.1)
    with pytest.raises(ValueRangeError, match="has no LoRA adapters"), disable_adapters(plain):
        pass
    with pytest.raises(DTypeError, match="must be an nn.Module"):
        trainable_parameters(3)  # type: ignore[arg-type]
    model = _mlp()
    apply_lora(model, LoraConfig(target_modules=["fc1"]))
    with pytest.raises(ValueRangeError, match=r"no adapter 'x' \(adapters: \['default'\]\)"):
        set_adapter(model, "x")
    with pytest.raises(ValueRangeError, match="no adapter"):
        merge(model, ["x"])
    with pytest.raises(ValueRangeError, match="no adapter"):
        save_adapter(model, tmp_path, adapter="x")
    with pytest.raises(DTypeError, match="peft_format"):
        save_adapter(model, tmp_path, peft_format="yes")  # type: ignore[arg-type]
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueRangeError, match="not a directory"):
        save_adapter(model, tmp_path / "file")
    merge(model)
    with pytest.raises(ValueRangeError, match="unmerge"):
        set_adapter(model, "default")
    with pytest.raises(RecordNotFoundError, match="adapter_config.json"):
        load_adapter(_mlp(), tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{not json")
    with pytest.raises(CorruptRecordError, match="not readable JSON"):
        load_adapter(_mlp(), bad)
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": -1}))
    with pytest.raises(CorruptRecordError, match="r must be a positive int"):
        load_adapter(_mlp(), bad)


# -- more layer configurations, PiSSA against torch's SVD, state dicts -------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {"padding": 2, "dilation": 2},
    {"padding": 1, "padding_mode": "reflect"},
    {"padding": "same"},
], ids=["dilation", "reflect", "same"])
def test_conv2d_variants_match_torch(kwargs: dict[str, object]) -> None:
    ember.manual_seed(0)
    base = nn.Conv2d(2, 3, 3, **kwargs).to(DEV)
    model = nn.Sequential(base)
    apply_lora(model, LoraConfig(r=2, lora_alpha=2, target_modules=["0"]))
    _randomise(model)
    layer = model[0]
    x_np = np.random.default_rng(5).normal(size=(1, 2, 6, 6))
    ref_base = torch.nn.Conv2d(2, 3, 3, **kwargs).double()
    ref_a = torch.nn.Conv2d(2, 2, 3, bias=False, **kwargs).double()
    with torch.no_grad():
        ref_base.weight.copy_(t(base.weight))
        ref_base.bias.copy_(t(base.bias))
        ref_a.weight.copy_(t(layer.lora_A["default"].weight))
    xt = torch.from_numpy(x_np)
    ref = ref_base(xt) + torch.nn.functional.conv2d(ref_a(xt), t(layer.lora_B["default"].weight))
    np.testing.assert_allclose(layer(e(x_np)).numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    merge(model)
    np.testing.assert_allclose(layer(e(x_np)).numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_pissa_takes_the_top_singular_directions() -> None:
    ember.manual_seed(0)
    base = nn.Linear(10, 7).to(DEV)
    w = t(base.weight)
    model = nn.Sequential(base)
    apply_lora(model, LoraConfig(r=3, lora_alpha=6, target_modules=["0"], init_lora_weights="pissa"))
    layer = model[0]
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    best = (u[:, :3] * s[:3]) @ vh[:3]  # the best rank-3 approximation: what scaling * B @ A must equal
    np.testing.assert_allclose(layer.get_delta_weight("default").numpy(), best.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(t(base.weight).numpy(), (w - best).numpy(), rtol=1e-4, atol=1e-5)
    # A and B share the singular values evenly: A @ A.T and B.T @ B are both diag(S_r / scaling)
    a, b = t(layer.lora_A["default"].weight), t(layer.lora_B["default"].weight)
    np.testing.assert_allclose((a @ a.T).numpy(), torch.diag(s[:3] / 2).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose((b.T @ b).numpy(), torch.diag(s[:3] / 2).numpy(), rtol=1e-4, atol=1e-5)


def test_state_dict_uses_peft_names_and_round_trips() -> None:
    model = _mlp()
    apply_lora(model, LoraConfig(r=2, target_modules=["fc1"], modules_to_save=["head"]))
    _randomise(model)
    keys = list(model.state_dict())
    assert keys == ["fc1.base_layer.weight", "fc1.base_layer.bias", "fc1.lora_A.default.weight",
                    "fc1.lora_B.default.weight", "fc2.weight", "fc2.bias", "head.original_module.weight",
                    "head.original_module.bias", "head.modules_to_save.default.weight",
                    "head.modules_to_save.default.bias"]
    other = _mlp(7)
    apply_lora(other, LoraConfig(r=2, target_modules=["fc1"], modules_to_save=["head"]))
    other.load_state_dict(model.state_dict())
    x = e(np.ones((2, 6)))
    np.testing.assert_allclose(other(x).numpy(), model(x).numpy(), rtol=1e-6)


def test_inference_on_a_plain_device() -> None:
    ember.manual_seed(0)
    model = MLP()  # the default (non-differentiable) device
    apply_lora(model, LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
    x = ember.ones(3, 6)
    out = model(x).numpy()
    merge(model)
    np.testing.assert_allclose(model(x).numpy(), out, rtol=1e-5, atol=1e-6)


def test_nested_modules_and_a_second_adapter_on_a_wrapped_model() -> None:
    ember.manual_seed(0)
    model = nn.Sequential(nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])).to(DEV)
    apply_lora(model, LoraConfig(target_modules=r"0\.\d"))
    assert _wrapped(model) == ["0.0", "0.1"]
    # the paths a second config sees are the wrapped layers' own, never their base_layer
    apply_lora(model, LoraConfig(target_modules=ParamGroup(model, regex=r"^0\.1\.")), adapter="b")
    assert model[0][1].adapter_names == ["default", "b"] and model[0][0].adapter_names == ["default"]


@pytest.mark.parametrize("dtype", [ember.float64, ember.bfloat16], ids=str)
def test_adapters_take_the_base_dtype(dtype: object) -> None:
    ember.manual_seed(0)
    model = MLP().to(DEV).to(dtype)
    apply_lora(model, LoraConfig(r=2, target_modules=["fc1", "fc2"], init_lora_weights=False))
    assert model.fc1.lora_A["default"].weight.dtype == dtype
    x = ember.ones(2, 6, device=DEV, dtype=dtype)
    out = model(x)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert model.fc2.lora_B["default"].weight.grad.dtype == dtype
    merge(model)
    tol = 1e-10 if dtype == ember.float64 else 0.1
    np.testing.assert_allclose(model(x).float().numpy(), out.float().numpy(), rtol=tol, atol=tol)


def test_a_refused_layer_leaves_the_model_unchanged() -> None:
    ember.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).to(DEV)
    weights = [p.numpy().copy() for p in model.parameters()]
    # PiSSA with r=4 fits the first layer but not the second (rank <= 2): nothing may change, not even layer 0
    with pytest.raises(ValueRangeError, match=r"needs r <= min\(2, 8\) of the weight matrix \(2, 8\), got r=4"):
        apply_lora(model, LoraConfig(r=4, target_modules=["0", "1"], init_lora_weights="pissa"))
    assert type(model[0]) is nn.Linear and type(model[1]) is nn.Linear
    for p, w in zip(model.parameters(), weights):
        np.testing.assert_array_equal(p.numpy(), w)
        assert p.requires_grad
    apply_lora(model, LoraConfig(r=2, target_modules=["0"]))
    with pytest.raises(ValueRangeError, match="got r=4"):
        apply_lora(model, LoraConfig(r=4, target_modules=["0", "1"], init_lora_weights="pissa"), adapter="p")
    assert model[0].adapter_names == ["default"] and type(model[1]) is nn.Linear


def test_a_pissa_adapter_loads_onto_its_residual_base(tmp_path: object) -> None:
    model = _mlp()
    x = e(np.random.default_rng(6).normal(size=(2, 6)))
    apply_lora(model, LoraConfig(r=2, target_modules=["fc1", "fc2"], init_lora_weights="pissa"))
    _randomise(model)  # "trained"
    out = model(x).numpy()
    save_adapter(model, tmp_path)
    unload(model)  # the residual base model, which a PiSSA user saves beside the adapter
    load_adapter(model, tmp_path)  # must not run PiSSA on the residual again
    np.testing.assert_allclose(model(x).numpy(), out, rtol=1e-5, atol=1e-6)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert cfg["init_lora_weights"] == "pissa" and cfg["format"] == "ember-lora"
