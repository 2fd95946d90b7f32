"""LoRA on ``nn.MultiheadAttention``'s projections (``q_proj``/``k_proj``/``v_proj``/``out_proj``) against torch's
``multi_head_attention_forward`` with the adapted weights ``W + s · B @ A`` built from torch leaves (float64)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

import ember
from ember import nn
from ember.errors import DTypeError, ValueRangeError
from ember.nn import ParamGroup
from ember.records import IncompatibleStateError
from ember_lora import (
    LoraConfig,
    LoraMultiheadAttention,
    apply_lora,
    apply_qlora,
    delete_adapter,
    disable_adapters,
    load_adapter,
    merge,
    merge_and_unload,
    save_adapter,
    set_adapter,
    trainable_parameters,
    unload,
    unmerge,
)
from ember_lora.layers import ATTENTION_PROJECTIONS

DEV = ember.device("cpu").autodiff()
PROJ = ATTENTION_PROJECTIONS


def _t(x: ember.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.array(x.detach().numpy(), dtype=np.float64))


def _e(a: np.ndarray) -> ember.Tensor:
    return ember.tensor(np.asarray(a), dtype=ember.float32, device=DEV)


class Attn(nn.Module):
    """One attention module under a name, as in a transformer layer (``self_attn``)."""

    def __init__(self, e: int = 8, heads: int = 2, kdim: int | None = None, vdim: int | None = None,
                 batch_first: bool = True) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(e, heads, kdim=kdim, vdim=vdim, batch_first=batch_first)
        self.head = nn.Linear(e, 3)

    def forward(self, q: ember.Tensor, k: ember.Tensor | None = None, v: ember.Tensor | None = None) -> ember.Tensor:
        k = q if k is None else k
        v = k if v is None else v
        return self.head(self.self_attn(q, k, v, need_weights=False)[0])


def _model(seed: int = 0, **kw: object) -> Attn:
    ember.manual_seed(seed)
    m = Attn(**kw).to(DEV)  # type: ignore[arg-type]
    with ember.no_grad():  # non-zero biases: the hook must add to the biased projections
        rng = np.random.default_rng(seed + 10)
        for name, p in m.named_parameters():
            if "bias" in name:
                p.copy_(_e(rng.normal(0, 0.2, p.shape)))
    return m


def _randomise(model: nn.Module, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    with ember.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(_e(rng.normal(0, 0.3, p.shape)))


def _torch_reference(layer: LoraMultiheadAttention, q: np.ndarray, k: np.ndarray, v: np.ndarray, adapter: str,
                     batch_first: bool) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """torch's attention output with every adapted projection's weight ``W + s · B @ A`` (A, B torch leaves)."""
    m = layer.base_layer
    s = layer.scaling[adapter]
    leaves = {p: (_t(layer.lora_A[adapter][p].weight).requires_grad_(True),
                  _t(layer.lora_B[adapter][p].weight).requires_grad_(True)) for p in layer.projections[adapter]}

    def adapted(p: str, w: torch.Tensor) -> torch.Tensor:
        return w + s * leaves[p][1] @ leaves[p][0] if p in leaves else w

    e = m.embed_dim
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    if batch_first:
        qt, kt, vt = qt.transpose(0, 1), kt.transpose(0, 1), vt.transpose(0, 1)
    if m.in_proj_weight is not None:
        w = _t(m.in_proj_weight)
        packed = torch.cat([adapted(p, w[i * e:(i + 1) * e]) for i, p in enumerate(PROJ[:3])])
        sep = {}
    else:
        packed = None
        sep = {"use_separate_proj_weight": True,
               "q_proj_weight": adapted("q_proj", _t(m.q_proj_weight)),
               "k_proj_weight": adapted("k_proj", _t(m.k_proj_weight)),
               "v_proj_weight": adapted("v_proj", _t(m.v_proj_weight))}
    out, _ = torch.nn.functional.multi_head_attention_forward(
        qt, kt, vt, e, m.num_heads, packed, _t(m.in_proj_bias), None, None, False, 0.0,
        adapted("out_proj", _t(m.out_proj.weight)), _t(m.out_proj.bias), training=False, need_weights=False, **sep)
    return (out.transpose(0, 1) if batch_first else out), leaves


@pytest.mark.parametrize("case", ["self-packed", "self-seq-first", "cross-kdim-vdim", "q-v-only", "out-only"])
def test_forward_and_grads_match_torch(case: str) -> None:
    batch_first = case != "self-seq-first"
    kw = {"kdim": 6, "vdim": 5} if case == "cross-kdim-vdim" else {}
    targets = {"q-v-only": ["q_proj", "v_proj"], "out-only": ["out_proj"]}.get(case, ["q_proj", "k_proj", "v_proj",
                                                                                      "out_proj"])
    model = _model(batch_first=batch_first, **kw)  # type: ignore[arg-type]
    apply_lora(model, LoraConfig(r=3, lora_alpha=6, target_modules=targets))
    layer = model.self_attn
    assert isinstance(layer, LoraMultiheadAttention)
    assert layer.projections["default"] == tuple(p for p in PROJ if p in targets)
    _randomise(model)
    rng = np.random.default_rng(5)
    lead = (2, 4) if batch_first else (4, 2)
    q = rng.normal(size=(*lead, 8))
    k = rng.normal(size=(2, 5, kw.get("kdim", 8)) if batch_first else (5, 2, 8))
    v = rng.normal(size=(2, 5, kw.get("vdim", 8)) if batch_first else (5, 2, 8))
    if case != "cross-kdim-vdim":
        k = v = q
    g = rng.normal(size=(*lead, 8))
    out = layer(_e(q), _e(k), _e(v), need_weights=False)[0]
    (out * _e(g)).sum().backward()
    ref, leaves = _torch_reference(layer, q, k, v, "default", batch_first)
    (ref * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    for p, (a_t, b_t) in leaves.items():
        np.testing.assert_allclose(layer.lora_A["default"][p].weight.grad.numpy(), a_t.grad.numpy(), rtol=1e-3,
                                   atol=1e-5, err_msg=p)
        np.testing.assert_allclose(layer.lora_B["default"][p].weight.grad.numpy(), b_t.grad.numpy(), rtol=1e-3,
                                   atol=1e-5, err_msg=p)
    # the frozen base gets no gradient
    assert all(p.grad is None for p in layer.base_layer.parameters())


def test_unbatched_input_and_step_zero_is_a_no_op() -> None:
    model = _model()
    x = _e(np.random.default_rng(0).normal(size=(4, 8)))  # unbatched (L, E)
    before = model(x).numpy()
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"]))
    np.testing.assert_array_equal(model(x).numpy(), before)  # B = 0: exactly the base output
    _randomise(model)
    assert not np.allclose(model(x).numpy(), before)


@pytest.mark.parametrize("packed", [True, False], ids=["in_proj_weight", "separate-weights"])
def test_merge_unmerge_and_merge_and_unload(packed: bool) -> None:
    model = _model(**({} if packed else {"kdim": 6, "vdim": 6}))  # type: ignore[arg-type]
    weights = {n: p.numpy().copy() for n, p in model.named_parameters()}
    apply_lora(model, LoraConfig(r=2, lora_alpha=4, target_modules=r".*_proj"))
    _randomise(model)
    rng = np.random.default_rng(1)
    q, kv = _e(rng.normal(size=(2, 3, 8))), _e(rng.normal(size=(2, 5, 8 if packed else 6)))
    want = model(q, kv).numpy()
    merge(model)
    assert model.self_attn.merged_adapters == ["default"]
    np.testing.assert_allclose(model(q, kv).numpy(), want, rtol=1e-5, atol=1e-5)
    unmerge(model)
    np.testing.assert_allclose(model(q, kv).numpy(), want, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():  # unmerge gives the base weights back (to float rounding)
        if "base_layer" in n:
            np.testing.assert_allclose(p.numpy(), weights[n.replace("base_layer.", "")], rtol=0, atol=1e-6)
    merged = merge_and_unload(model)
    attn = merged.self_attn
    assert type(attn) is nn.MultiheadAttention and attn.projection_hook is None  # no call back into the wrapper
    np.testing.assert_allclose(merged(q, kv).numpy(), want, rtol=1e-5, atol=1e-5)


def test_disable_adapters_unload_and_delete_give_the_base_back() -> None:
    model = _model()
    x = _e(np.random.default_rng(0).normal(size=(2, 4, 8)))
    base = model(x).numpy()
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj", "out_proj"]))
    _randomise(model)
    adapted = model(x).numpy()
    merge(model)
    with disable_adapters(model):
        np.testing.assert_allclose(model(x).numpy(), base, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model(x).numpy(), adapted, rtol=1e-5, atol=1e-5)
    unmerge(model)
    plain = unload(model)
    assert type(plain.self_attn) is nn.MultiheadAttention and plain.self_attn.projection_hook is None
    np.testing.assert_allclose(plain(x).numpy(), base, rtol=1e-5, atol=1e-6)
    apply_lora(plain, LoraConfig(r=2, target_modules=["v_proj"]))
    delete_adapter(plain, "default")
    assert type(plain.self_attn) is nn.MultiheadAttention and plain.self_attn.projection_hook is None


def test_two_adapters_on_different_projections() -> None:
    model = _model()
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj"]))
    apply_lora(model, LoraConfig(r=4, target_modules=["v_proj", "out_proj"]), adapter="other")
    layer = model.self_attn
    assert layer.projections == {"default": ("q_proj",), "other": ("v_proj", "out_proj")}
    _randomise(model)
    x = _e(np.random.default_rng(0).normal(size=(2, 4, 8)))
    first = model(x).numpy()
    set_adapter(model, "other")
    assert layer.lora_A["other"]["v_proj"].weight.requires_grad
    assert not layer.lora_A["default"]["q_proj"].weight.requires_grad
    second = model(x).numpy()
    assert not np.allclose(first, second)
    ref, _ = _torch_reference(layer, x.numpy().astype(np.float64), x.numpy().astype(np.float64),
                              x.numpy().astype(np.float64), "other", True)
    np.testing.assert_allclose(layer(x, x, x, need_weights=False)[0].numpy(), ref.detach().numpy(), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("how", ["list", "regex", "module", "all-linear", "param-group"])
def test_target_modules_name_the_projections(how: str) -> None:
    model = _model()
    target = {
        "list": ["k_proj", "out_proj"],
        "regex": r"self_attn\.(k|out)_proj",
        "module": ["self_attn"],
        "all-linear": "all-linear",
        "param-group": ParamGroup(model, where=lambda name, _: name == "self_attn.in_proj_weight"),
    }[how]
    apply_lora(model, LoraConfig(r=2, target_modules=target))
    want = {"list": ("k_proj", "out_proj"), "regex": ("k_proj", "out_proj"), "module": PROJ, "all-linear": PROJ,
            "param-group": ("q_proj", "k_proj", "v_proj")}[how]
    assert model.self_attn.projections["default"] == want
    assert type(model.head) is nn.Linear  # the output head stays out of "all-linear", as in PEFT


def test_pissa_keeps_the_step_zero_output() -> None:
    model = _model()
    x = _e(np.random.default_rng(0).normal(size=(2, 4, 8)))
    before = model(x).numpy()
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj", "out_proj"], init_lora_weights="pissa"))
    np.testing.assert_allclose(model(x).numpy(), before, rtol=1e-4, atol=1e-5)
    assert float(model.self_attn.lora_B["default"]["q_proj"].weight.abs().sum()) > 0


def test_lora_only_bias_trains_the_attention_biases() -> None:
    model = _model()
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj"], bias="lora_only"))
    base = model.self_attn.base_layer
    assert base.in_proj_bias.requires_grad and base.out_proj.bias.requires_grad
    assert not base.in_proj_weight.requires_grad and not model.head.bias.requires_grad
    every = _model()
    apply_lora(every, LoraConfig(r=2, target_modules=["q_proj"], bias="all"))
    trained = sorted(n for n, p in every.named_parameters() if p.requires_grad and "lora_" not in n)
    assert trained == ["head.bias", "self_attn.base_layer.in_proj_bias", "self_attn.base_layer.out_proj.bias"]


def test_save_load_round_trip_and_mismatch(tmp_path: object) -> None:
    model = _model()
    apply_lora(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "out_proj"]))
    _randomise(model)
    x = _e(np.random.default_rng(0).normal(size=(2, 4, 8)))
    want = model(x).numpy()
    d = os.path.join(str(tmp_path), "adapter")
    save_adapter(model, d)
    keys = sorted(ember.records.load(os.path.join(d, "adapter_model.safetensors")))
    assert keys == sorted(f"self_attn.{p}.lora_{ab}.weight" for p in ("q_proj", "v_proj", "out_proj") for ab in "AB")
    fresh = _model()
    load_adapter(fresh, d)
    assert fresh.self_attn.projections["default"] == ("q_proj", "v_proj", "out_proj")
    np.testing.assert_allclose(fresh(x).numpy(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueRangeError, match="MultiheadAttention"):
        save_adapter(model, os.path.join(str(tmp_path), "peft"), peft_format=True)
    other = _model(e=12, heads=2)  # another base: every shape differs, the model is left as it was
    shapes = r"self_attn\.q_proj\.lora_A\.weight \(checkpoint \[2, 8\], model \[2, 12\]\)"
    with pytest.raises(IncompatibleStateError, match=shapes):
        load_adapter(other, d)
    assert type(other.self_attn) is nn.MultiheadAttention and other.self_attn.projection_hook is None


def test_seed_transformer_targets_q_k_v_out() -> None:
    from ember_train.models import text_transformer

    ember.manual_seed(0)
    model = text_transformer("small", 4, d_model=32, nhead=4, num_layers=2, dim_feedforward=64, dropout=0.0).to(DEV)
    apply_lora(model, LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"],
                                 init_lora_weights=False))
    attn = [m for _, m in model.named_modules() if isinstance(m, LoraMultiheadAttention)]
    assert len(attn) == 2
    trainable, _ = trainable_parameters(model)
    assert trainable == 2 * 4 * (4 * 32 + 32 * 4)  # 2 layers, 4 projections, A (4, 32) + B (32, 4)
    tokens = ember.tensor(np.random.default_rng(0).integers(0, 64, size=(3, 10)), dtype=ember.int64, device=DEV)
    model(tokens).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


def test_threads_share_one_adapted_module() -> None:
    model = _model()
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"]))
    _randomise(model)
    rng = np.random.default_rng(3)
    xs = [_e(rng.normal(size=(2, 4, 8))) for _ in range(6)]
    with ember.no_grad():
        want = [model(x).numpy() for x in xs]
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with ember.no_grad():
                got[i] = model(xs[i]).numpy()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w)


def test_qlora_leaves_attention_float() -> None:
    model = _model()
    apply_qlora(model, LoraConfig(r=2, target_modules=["q_proj", "head"]))
    assert isinstance(model.self_attn, LoraMultiheadAttention)
    assert model.self_attn.base_layer.in_proj_weight.dtype == ember.float32


def test_bad_input() -> None:
    with pytest.raises(DTypeError, match="MultiheadAttention"):
        LoraMultiheadAttention(nn.Linear(2, 2))  # type: ignore[arg-type]
    mha = nn.MultiheadAttention(8, 2)
    layer = LoraMultiheadAttention(mha)
    with pytest.raises(ValueRangeError, match="already has a projection_hook"):
        LoraMultiheadAttention(mha)
    with pytest.raises(ValueRangeError, match="projections"):
        layer.update_layer("a", LoraConfig(r=2, target_modules=["x"]), projections=["qkv"])
    with pytest.raises(ValueRangeError, match="pissa"):
        layer.update_layer("a", LoraConfig(r=9, target_modules=["x"], init_lora_weights="pissa"))
    model = _model()
    with pytest.raises(ValueRangeError, match="selects no module"):
        apply_lora(model, LoraConfig(r=2, target_modules=["w_proj"]))
    # a refused config leaves the attention module unwrapped and unhooked
    with pytest.raises(ValueRangeError, match="pissa"):
        apply_lora(model, LoraConfig(r=9, target_modules=["q_proj"], init_lora_weights="pissa"))
    assert type(model.self_attn) is nn.MultiheadAttention and model.self_attn.projection_hook is None


def test_deepcopy_keeps_each_copy_on_its_own_adapters() -> None:
    import copy

    model = _model()
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj", "out_proj"]))
    _randomise(model)
    x = _e(np.random.default_rng(0).normal(size=(2, 4, 8)))
    want = model(x).numpy()
    twin = copy.deepcopy(model)
    assert twin.self_attn.base_layer.projection_hook.__self__ is twin.self_attn  # the copy's hook is the copy's
    np.testing.assert_array_equal(twin(x).numpy(), want)
    with ember.no_grad():
        twin.self_attn.lora_B["default"]["q_proj"].weight.add_(1.0)
    np.testing.assert_array_equal(model(x).numpy(), want)
    assert not np.allclose(twin(x).numpy(), want)
