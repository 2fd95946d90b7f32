"""Sequence layers (MultiheadAttention, Transformer*, RNN/LSTM/GRU and cells) against PyTorch: identical weights
(torch's state_dict loaded into ember) and inputs, float64, forward outputs and gradients w.r.t. inputs, initial
states and every parameter; default initialisation; dropout in training mode; typed errors."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device
from ember.errors import DTypeError, EmberError, ShapeError, ValueRangeError
from ember.nn import functional as F
from ember.nn.sequence import (
    GRU,
    LSTM,
    RNN,
    GRUCell,
    LSTMCell,
    MultiheadAttention,
    RNNBase,
    RNNCell,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

torch = pytest.importorskip("torch")

# torch warns when a bool padding mask meets a float attention mask; mixing them is part of what is tested
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched:UserWarning",
                                        "ignore:enable_nested_tensor is True:UserWarning")

AD = Device.flex().autodiff()
TOL = {"rtol": 1e-9, "atol": 1e-10}


# -- helpers -----------------------------------------------------------------------------------------------------
def E(a: np.ndarray, grad: bool = True) -> ember.Tensor:  # noqa: N802 - reads as "Ember"
    return ember.tensor(np.ascontiguousarray(a), device=AD, requires_grad=grad and a.dtype.kind == "f")


def T(a: np.ndarray, grad: bool = True) -> Any:  # noqa: N802 - reads as "Torch"
    t = torch.tensor(np.ascontiguousarray(a))
    return t.requires_grad_(True) if grad and a.dtype.kind == "f" else t


def load(em: Any, tm: Any) -> None:
    """Copy torch's weights into the ember module; the key sets must be identical."""
    tsd = tm.state_dict()
    assert list(em.state_dict()) == list(tsd)
    res = em.load_state_dict({k: ember.tensor(v.detach().numpy(), device=AD) for k, v in tsd.items()})
    assert res.missing_keys == [] and res.unexpected_keys == []


def flat(out: Any) -> list[Any]:
    """Tensors of a (possibly nested) module output, in order; None entries dropped."""
    if out is None:
        return []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return [out]


def compare(em: Any, tm: Any, e_in: list[Any], t_in: list[Any], call: Any = None, rng: Any = None,
            **tol: float) -> None:
    """Forward both modules, compare every output, backprop a random projection of all outputs and compare the
    gradients of every (float) input and every parameter."""
    tol = tol or TOL
    call = call or (lambda m, xs: m(*xs))
    rng = rng or np.random.default_rng(0)
    e_out, t_out = flat(call(em, e_in)), flat(call(tm, t_in))
    assert len(e_out) == len(t_out)
    e_loss, t_loss = None, None
    for eo, to in zip(e_out, t_out):
        assert tuple(eo.shape) == tuple(to.shape)
        np.testing.assert_allclose(eo.numpy(), to.detach().numpy(), **tol)
        w = rng.standard_normal(tuple(to.shape))
        el, tl = (eo * E(w, False)).sum(), (to * torch.tensor(w)).sum()
        e_loss = el if e_loss is None else e_loss + el
        t_loss = tl if t_loss is None else t_loss + tl
    e_loss.backward()
    t_loss.backward()
    for i, (ei, ti) in enumerate(zip(e_in, t_in)):
        if isinstance(ti, torch.Tensor) and ti.requires_grad:
            assert ei.grad is not None, f"input {i} got no gradient"
            np.testing.assert_allclose(ei.grad.numpy(), ti.grad.numpy(), **tol, err_msg=f"input {i}")
    tp = dict(tm.named_parameters())
    ep = dict(em.named_parameters())
    assert sorted(ep) == sorted(tp)
    for name, p in tp.items():
        assert ep[name].grad is not None, f"{name} got no gradient"
        np.testing.assert_allclose(ep[name].grad.numpy(), p.grad.numpy(), **tol, err_msg=name)


def pair(em_cls: Any, tm_cls: Any, *args: Any, eval_mode: bool = True, **kw: Any) -> tuple[Any, Any]:
    tm = tm_cls(*args, dtype=torch.float64, **kw)
    em = em_cls(*args, dtype=ember.float64, device=AD, **kw)
    load(em, tm)
    if eval_mode:
        tm.eval()
        em.eval()
    return em, tm


@pytest.fixture
def rng(request: Any) -> np.random.Generator:
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


# -- MultiheadAttention ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("mask", [None, "bool2d", "float2d", "bool3d", "causal"])
@pytest.mark.parametrize("kpm", [False, True])
def test_mha_self_attention(batch_first: bool, need_weights: bool, average: bool, mask: Any, kpm: bool,
                            rng: np.random.Generator) -> None:
    L, N, Emb, H = 5, 3, 8, 2
    em, tm = pair(MultiheadAttention, torch.nn.MultiheadAttention, Emb, H, batch_first=batch_first)
    x = rng.standard_normal((N, L, Emb) if batch_first else (L, N, Emb))
    am: Any = None
    if mask == "bool2d":
        am = np.triu(np.ones((L, L), bool), 1)
    elif mask == "float2d":
        am = rng.standard_normal((L, L))
    elif mask == "bool3d":
        am = rng.random((N * H, L, L)) < 0.3
        am[..., 0] = False  # every row keeps a key (an all-masked row is NaN in torch's weights path)
    elif mask == "causal":
        am = np.triu(np.ones((L, L), bool), 1)
    kp = None
    if kpm:
        kp = np.zeros((N, L), bool)
        kp[1, 3:] = True
        kp[2, -1] = True
    is_causal = mask == "causal"
    e_x, t_x = E(x), T(x)

    def call(m: Any, xs: list[Any]) -> Any:
        mk = None if am is None else (E(am, False) if xs[0] is e_x else T(am, False))
        kk = None if kp is None else (E(kp, False) if xs[0] is e_x else T(kp, False))
        return m(xs[0], xs[0], xs[0], key_padding_mask=kk, need_weights=need_weights, attn_mask=mk,
                 average_attn_weights=average, is_causal=is_causal)

    compare(em, tm, [e_x], [t_x], call, rng)


@pytest.mark.parametrize("kv_same", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_cross_attention(kv_same: bool, need_weights: bool, rng: np.random.Generator) -> None:
    em, tm = pair(MultiheadAttention, torch.nn.MultiheadAttention, 12, 3)
    q, k, v = rng.standard_normal((4, 2, 12)), rng.standard_normal((6, 2, 12)), rng.standard_normal((6, 2, 12))
    kp = np.zeros((2, 6), bool)
    kp[0, 4:] = True
    if kv_same:
        def call(m: Any, xs: list[Any]) -> Any:
            mk = E(kp, False) if isinstance(xs[0], ember.Tensor) else T(kp, False)
            return m(xs[0], xs[1], xs[1], key_padding_mask=mk, need_weights=need_weights)

        compare(em, tm, [E(q), E(k)], [T(q), T(k)], call, rng)
    else:
        compare(em, tm, [E(q), E(k), E(v)], [T(q), T(k), T(v)],
                lambda m, xs: m(*xs, need_weights=need_weights), rng)


@pytest.mark.parametrize("kw", [
    {"kdim": 5, "vdim": 7},
    {"bias": False},
    {"add_bias_kv": True},
    {"add_zero_attn": True},
    {"add_bias_kv": True, "add_zero_attn": True, "kdim": 3, "vdim": 3},
])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_variants(kw: dict[str, Any], need_weights: bool, rng: np.random.Generator) -> None:
    em, tm = pair(MultiheadAttention, torch.nn.MultiheadAttention, 8, 4, **kw)
    q = rng.standard_normal((3, 2, 8))
    k = rng.standard_normal((5, 2, kw.get("kdim", 8)))
    v = rng.standard_normal((5, 2, kw.get("vdim", 8)))
    am = rng.standard_normal((3, 5))
    kp = np.zeros((2, 5), bool)
    kp[1, 0] = True

    def call(m: Any, xs: list[Any]) -> Any:
        conv = (lambda a: E(a, False)) if isinstance(xs[0], ember.Tensor) else (lambda a: T(a, False))
        return m(*xs, attn_mask=conv(am), key_padding_mask=conv(kp), need_weights=need_weights)

    compare(em, tm, [E(q), E(k), E(v)], [T(q), T(k), T(v)], call, rng)


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_unbatched(need_weights: bool, rng: np.random.Generator) -> None:
    em, tm = pair(MultiheadAttention, torch.nn.MultiheadAttention, 6, 2, batch_first=True)
    q, k = rng.standard_normal((4, 6)), rng.standard_normal((5, 6))
    am = rng.random((2, 4, 5)) < 0.3
    am[..., 1] = False
    kp = np.array([False, False, True, False, True])

    def call(m: Any, xs: list[Any]) -> Any:
        conv = (lambda a: E(a, False)) if isinstance(xs[0], ember.Tensor) else (lambda a: T(a, False))
        return m(xs[0], xs[1], xs[1], attn_mask=conv(am), key_padding_mask=conv(kp), need_weights=need_weights)

    compare(em, tm, [E(q), E(k)], [T(q), T(k)], call, rng)
    out, w = em(E(q), E(k), E(k), need_weights=True)
    assert out.shape == (4, 6) and w.shape == (4, 5)


def test_mha_is_causal_without_mask_builds_the_causal_mask(rng: np.random.Generator) -> None:
    # torch demands attn_mask with is_causal; ember builds the causal mask, which equals passing it explicitly
    em, tm = pair(MultiheadAttention, torch.nn.MultiheadAttention, 8, 2)
    x = rng.standard_normal((5, 2, 8))
    causal = T(np.triu(np.ones((5, 5), bool), 1), False)
    for need_weights in (True, False):
        ref, _ = tm(T(x), T(x), T(x), attn_mask=causal, is_causal=True, need_weights=need_weights)
        out, _ = em(E(x), E(x), E(x), is_causal=True, need_weights=need_weights)
        np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **TOL)


def test_mha_dropout_training(rng: np.random.Generator) -> None:
    em = MultiheadAttention(8, 2, dropout=0.5, dtype=ember.float64, device=AD)
    x = E(rng.standard_normal((40, 4, 8)))
    em.eval()
    _, w_eval = em(x, x, x, average_attn_weights=False)
    em.train()
    ember.manual_seed(0)
    _, w_train = em(x, x, x, average_attn_weights=False)
    ratio = w_train.numpy() / w_eval.numpy()
    # each weight is dropped (0) or scaled by 1 / (1 - p) = 2; about half are dropped
    assert np.all(np.isclose(ratio, 0.0) | np.isclose(ratio, 2.0))
    frac = np.isclose(ratio, 0.0).mean()
    assert 0.45 < frac < 0.55
    out1, _ = em(x, x, x, need_weights=False)
    out2, _ = em(x, x, x, need_weights=False)
    assert not np.allclose(out1.numpy(), out2.numpy())


def test_mha_init_and_parameters() -> None:
    ember.manual_seed(1)
    m = MultiheadAttention(16, 4)
    sd = m.state_dict()
    assert list(sd) == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    assert m.in_proj_weight.shape == (48, 16) and m.in_proj_weight.dtype == ember.float32
    assert m.head_dim == 4 and m.q_proj_weight is None and m.bias_k is None
    w = m.in_proj_weight.numpy()
    bound = math.sqrt(6 / (16 + 48))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.all(m.in_proj_bias.numpy() == 0) and np.all(m.out_proj.bias.numpy() == 0)
    ow = m.out_proj.weight.numpy()
    assert np.abs(ow).max() <= 1 / math.sqrt(16) and ow.std() > 0.1
    sep = MultiheadAttention(8, 2, kdim=3, vdim=5, add_bias_kv=True)
    assert [n for n, _ in sep.named_parameters()] == ["q_proj_weight", "k_proj_weight", "v_proj_weight",
                                                      "in_proj_bias", "bias_k", "bias_v", "out_proj.weight",
                                                      "out_proj.bias"]
    assert sep.k_proj_weight.shape == (8, 3) and sep.bias_k.shape == (1, 1, 8)
    assert all(p.requires_grad for p in sep.parameters())


def test_mha_float32_smoke(rng: np.random.Generator) -> None:
    tm = torch.nn.MultiheadAttention(8, 2).eval()
    em = MultiheadAttention(8, 2, device=AD).eval()
    load(em, tm)
    x = rng.standard_normal((5, 2, 8)).astype(np.float32)
    out, w = em(E(x), E(x), E(x))
    ref, rw = tm(T(x), T(x), T(x))
    assert out.dtype == ember.float32
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.numpy(), rw.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_mha_errors() -> None:
    with pytest.raises(ValueRangeError, match=r"MultiheadAttention.*embed_dim \(10\).*divisible.*num_heads \(3\)"):
        MultiheadAttention(10, 3)
    with pytest.raises(ValueRangeError, match="MultiheadAttention: dropout"):
        MultiheadAttention(8, 2, dropout=1.5)
    with pytest.raises(ValueRangeError, match="num_heads must be positive"):
        MultiheadAttention(8, 0)
    m = MultiheadAttention(8, 2, dtype=ember.float64, device=AD)
    x = ember.zeros(4, 2, 8, dtype=ember.float64, device=AD)
    with pytest.raises(ShapeError, match=r"MultiheadAttention: query has 6 features \(shape \(4, 2, 6\)\).*ed_dim=8"):
        y = ember.zeros(4, 2, 6, dtype=ember.float64, device=AD)
        m(y, y, y)
    with pytest.raises(ShapeError, match=r"key has 5 features.*kdim=8"):
        k = ember.zeros(3, 2, 5, dtype=ember.float64, device=AD)
        m(x, k, k)
    with pytest.raises(ShapeError, match=r"key and value must have the same sequence.*\(3, 2, 8\).*\(4, 2, 8\)"):
        m(x, ember.zeros(3, 2, 8, dtype=ember.float64, device=AD), x)
    with pytest.raises(ShapeError, match=r"same batch size.*\(4, 2, 8\).*\(4, 3, 8\)"):
        k = ember.zeros(4, 3, 8, dtype=ember.float64, device=AD)
        m(x, k, k)
    with pytest.raises(ShapeError, match=r"query should be unbatched 2-D .* got shape \(2, 4, 2, 8\)"):
        y = ember.zeros(2, 4, 2, 8, dtype=ember.float64, device=AD)
        m(y, y, y)
    with pytest.raises(ShapeError, match=r"key and value must be 3-D too"):
        m(x, x[0], x[0])
    with pytest.raises(ShapeError, match=r"attn_mask of shape \(4, 5\) should be 2-D \(4, 4\) or 3-D \(4, 4, 4\)"):
        m(x, x, x, attn_mask=ember.zeros(4, 5, dtype=ember.bool_, device=AD))
    with pytest.raises(ShapeError, match=r"attn_mask to be None, 2-D .* got shape \(4,\)"):
        m(x, x, x, attn_mask=ember.zeros(4, dtype=ember.bool_, device=AD))
    with pytest.raises(ShapeError, match=r"key_padding_mask of shape \(2, 4\).*got \(2, 3\)"):
        m(x, x, x, key_padding_mask=ember.zeros(2, 3, dtype=ember.bool_, device=AD))
    with pytest.raises(ShapeError, match=r"key_padding_mask to be None or 2-D"):
        m(x, x, x, key_padding_mask=ember.zeros(4, dtype=ember.bool_, device=AD))
    with pytest.raises(DTypeError, match="only bool and floating types of attn_mask"):
        m(x, x, x, attn_mask=ember.zeros(4, 4, dtype=ember.int64, device=AD))
    with pytest.raises(DTypeError, match="query, key and value must have the same dtype"):
        m(x, x.float(), x.float())
    with pytest.raises(DTypeError, match="expected query to be a Tensor, got list"):
        m([1.0], x, x)
    with pytest.raises(DTypeError, match="floating-point tensor, got dtype int64"):
        xi = ember.zeros(4, 2, 8, dtype=ember.int64, device=AD)
        m(xi, xi, xi)


# -- Transformer layers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer(norm_first: bool, activation: str, batch_first: bool, rng: np.random.Generator) -> None:
    em, tm = pair(TransformerEncoderLayer, torch.nn.TransformerEncoderLayer, 8, 2, 16, 0.1, activation,
                  norm_first=norm_first, batch_first=batch_first)
    L, N = 5, 3
    x = rng.standard_normal((N, L, 8) if batch_first else (L, N, 8))
    am = rng.standard_normal((L, L))
    kp = np.zeros((N, L), bool)
    kp[0, -2:] = True

    def call(m: Any, xs: list[Any]) -> Any:
        conv = (lambda a: E(a, False)) if isinstance(xs[0], ember.Tensor) else (lambda a: T(a, False))
        return m(xs[0], src_mask=conv(am), src_key_padding_mask=conv(kp))

    compare(em, tm, [E(x)], [T(x)], call, rng)


def test_encoder_layer_callable_activation_no_bias_unbatched(rng: np.random.Generator) -> None:
    tm = torch.nn.TransformerEncoderLayer(6, 3, 10, activation=torch.nn.functional.silu, bias=False,
                                          layer_norm_eps=1e-3, dtype=torch.float64).eval()
    em = TransformerEncoderLayer(6, 3, 10, activation=F.silu, bias=False, layer_norm_eps=1e-3,
                                 dtype=ember.float64, device=AD).eval()
    load(em, tm)
    assert em.norm1.bias is None and em.linear1.bias is None and em.self_attn.in_proj_bias is None
    x = rng.standard_normal((4, 6))
    compare(em, tm, [E(x)], [T(x)], None, rng)
    causal = np.triu(np.ones((4, 4), bool), 1)
    compare(em, tm, [E(x)], [T(x)], lambda m, xs: m(xs[0], src_mask=(E(causal, False) if isinstance(
        xs[0], ember.Tensor) else T(causal, False)), is_causal=True), rng)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer(norm_first: bool, activation: str, rng: np.random.Generator) -> None:
    em, tm = pair(TransformerDecoderLayer, torch.nn.TransformerDecoderLayer, 8, 4, 12, 0.1, activation,
                  norm_first=norm_first, batch_first=True)
    tgt, mem = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 7, 8))
    tmask = np.triu(np.ones((5, 5), bool), 1)
    mkp = np.zeros((2, 7), bool)
    mkp[1, 5:] = True
    tkp = np.zeros((2, 5), bool)
    tkp[0, 4] = True

    def call(m: Any, xs: list[Any]) -> Any:
        conv = (lambda a: E(a, False)) if isinstance(xs[0], ember.Tensor) else (lambda a: T(a, False))
        return m(xs[0], xs[1], tgt_mask=conv(tmask), memory_key_padding_mask=conv(mkp),
                 tgt_key_padding_mask=conv(tkp))

    compare(em, tm, [E(tgt), E(mem)], [T(tgt), T(mem)], call, rng)


def test_encoder_and_decoder_stacks(rng: np.random.Generator) -> None:
    tl = torch.nn.TransformerEncoderLayer(8, 2, 16, dtype=torch.float64)
    el = TransformerEncoderLayer(8, 2, 16, dtype=ember.float64, device=AD)
    tm = torch.nn.TransformerEncoder(tl, 2, norm=torch.nn.LayerNorm(8, dtype=torch.float64),
                                     enable_nested_tensor=False).eval()
    em = TransformerEncoder(el, 2, norm=ember.nn.LayerNorm(8, dtype=ember.float64, device=AD)).eval()
    # perturb torch's clones so each layer differs (a load that mixed layers up would then fail)
    with torch.no_grad():
        for p in tm.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    load(em, tm)
    x = rng.standard_normal((6, 2, 8))
    mask = np.triu(np.full((6, 6), -np.inf), 1)
    compare(em, tm, [E(x)], [T(x)], lambda m, xs: m(xs[0], mask=(E(mask, False) if isinstance(
        xs[0], ember.Tensor) else T(mask, False))), rng)

    tdl = torch.nn.TransformerDecoderLayer(8, 2, 16, dtype=torch.float64, norm_first=True)
    edl = TransformerDecoderLayer(8, 2, 16, dtype=ember.float64, device=AD, norm_first=True)
    tdm = torch.nn.TransformerDecoder(tdl, 3).eval()
    edm = TransformerDecoder(edl, 3).eval()
    with torch.no_grad():
        for p in tdm.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    load(edm, tdm)
    tgt, mem = rng.standard_normal((4, 2, 8)), rng.standard_normal((6, 2, 8))
    compare(edm, tdm, [E(tgt), E(mem)], [T(tgt), T(mem)], None, rng)


def test_transformer_full(rng: np.random.Generator) -> None:
    tm = torch.nn.Transformer(8, 2, 2, 2, 16, dtype=torch.float64).eval()
    em = Transformer(8, 2, 2, 2, 16, dtype=ember.float64, device=AD).eval()
    load(em, tm)
    src, tgt = rng.standard_normal((6, 2, 8)), rng.standard_normal((4, 2, 8))
    tmask_t = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    tmask_e = Transformer.generate_square_subsequent_mask(4, dtype=ember.float64, device=AD)
    np.testing.assert_array_equal(tmask_e.numpy(), tmask_t.numpy())
    compare(em, tm, [E(src), E(tgt)], [T(src), T(tgt)],
            lambda m, xs: m(*xs, tgt_mask=tmask_e if isinstance(xs[0], ember.Tensor) else tmask_t), rng)
    # every matrix was re-drawn with xavier_uniform_
    w = Transformer(8, 2, 1, 1, 16).encoder.layers[0].linear1.weight.numpy()
    assert np.abs(w).max() <= math.sqrt(6 / 24) and np.abs(w).max() > 0.5 * math.sqrt(6 / 24)


def test_encoder_deepcopies_the_layer() -> None:
    layer = TransformerEncoderLayer(8, 2, 16, dtype=ember.float64, device=AD)
    enc = TransformerEncoder(layer, 3)
    assert len(enc.layers) == 3
    names = [n for n, _ in enc.named_parameters()]
    assert names[0] == "layers.0.self_attn.in_proj_weight" and names[-1] == "layers.2.norm2.bias"
    w0, w1 = enc.layers[0].linear1.weight, enc.layers[1].linear1.weight
    assert w0 is not w1 and w0 is not layer.linear1.weight
    np.testing.assert_array_equal(w0.numpy(), layer.linear1.weight.numpy())  # same initial values
    with ember.no_grad():
        w0.copy_(ember.zeros(16, 8, dtype=ember.float64, device=AD))
    assert np.abs(w1.numpy()).sum() > 0 and np.abs(layer.linear1.weight.numpy()).sum() > 0
    assert w1.requires_grad and type(w1).__name__ == "Parameter"


def test_transformer_dropout_training(rng: np.random.Generator) -> None:
    em = TransformerEncoderLayer(8, 2, 16, dropout=0.5, dtype=ember.float64, device=AD)
    x = E(rng.standard_normal((5, 2, 8)))
    a, b = em(x).numpy(), em(x).numpy()
    assert not np.allclose(a, b)
    em.eval()
    np.testing.assert_array_equal(em(x).numpy(), em(x).numpy())
    zero = TransformerEncoderLayer(8, 2, 16, dropout=0.0, dtype=ember.float64, device=AD)
    np.testing.assert_array_equal(zero(x).numpy(), zero.eval()(x).numpy())


def test_transformer_float32_smoke(rng: np.random.Generator) -> None:
    tm = torch.nn.TransformerDecoderLayer(8, 2, 16).eval()
    em = TransformerDecoderLayer(8, 2, 16, device=AD).eval()
    load(em, tm)
    tgt, mem = rng.standard_normal((3, 2, 8)).astype(np.float32), rng.standard_normal((5, 2, 8)).astype(np.float32)
    np.testing.assert_allclose(em(E(tgt), E(mem)).numpy(), tm(T(tgt), T(mem)).detach().numpy(), rtol=1e-4,
                               atol=1e-5)


def test_transformer_errors() -> None:
    with pytest.raises(ValueRangeError, match=r"EncoderLayer: activation should be 'relu' or 'gelu'.*'tanh'"):
        TransformerEncoderLayer(8, 2, activation="tanh")
    with pytest.raises(DTypeError, match=r"TransformerDecoderLayer: activation must be .* got int"):
        TransformerDecoderLayer(8, 2, activation=3)
    with pytest.raises(ValueRangeError, match=r"embed_dim \(8\) must be divisible by num_heads \(3\)"):
        TransformerEncoderLayer(8, 3)
    with pytest.raises(ValueRangeError, match="TransformerEncoderLayer: dropout"):
        TransformerEncoderLayer(8, 2, dropout=-0.1)
    with pytest.raises(DTypeError, match="TransformerEncoder: expected a TransformerEncoderLayer, got"):
        TransformerEncoder(TransformerDecoderLayer(8, 2, 16), 2)
    with pytest.raises(ValueRangeError, match="TransformerDecoder: num_layers must be non-negative"):
        TransformerDecoder(TransformerDecoderLayer(8, 2, 16), -1)
    layer = TransformerEncoderLayer(8, 2, 16, dtype=ember.float64, device=AD)
    with pytest.raises(ShapeError, match=r"EncoderLayer: src has 6 features \(shape \(3, 2, 6\)\).*d_model=8"):
        layer(ember.zeros(3, 2, 6, dtype=ember.float64, device=AD))
    with pytest.raises(ShapeError, match=r"TransformerEncoderLayer: expected src to be 2-D .* got shape \(8,\)"):
        layer(ember.zeros(8, dtype=ember.float64, device=AD))
    dec = TransformerDecoderLayer(8, 2, 16, dtype=ember.float64, device=AD)
    with pytest.raises(ShapeError, match=r"tgt and memory must both be batched .* \(3, 2, 8\) and \(5, 8\)"):
        dec(ember.zeros(3, 2, 8, dtype=ember.float64, device=AD), ember.zeros(5, 8, dtype=ember.float64, device=AD))
    tr = Transformer(8, 2, 1, 1, 16, dtype=ember.float64, device=AD)
    with pytest.raises(ShapeError, match=r"Transformer: the batch number of src and tgt must be equal"):
        tr(ember.zeros(3, 2, 8, dtype=ember.float64, device=AD), ember.zeros(3, 4, 8, dtype=ember.float64,
                                                                              device=AD))
    with pytest.raises(ShapeError, match=r"Transformer: the feature number .* d_model=8"):
        tr(ember.zeros(3, 2, 4, dtype=ember.float64, device=AD), ember.zeros(3, 2, 4, dtype=ember.float64,
                                                                              device=AD))


# -- recurrent layers --------------------------------------------------------------------------------------------
RNN_CASES = [
    {},
    {"num_layers": 2},
    {"bidirectional": True},
    {"num_layers": 3, "bidirectional": True, "batch_first": True},
    {"bias": False, "num_layers": 2},
]


def _rnn_inputs(kind: str, kw: dict[str, Any], rng: np.random.Generator, batched: bool, with_hx: bool,
                hidden: int, proj: int = 0) -> tuple[list[Any], list[Any]]:
    L, N, F_in = 5, 3, 4
    shape = ((N, L, F_in) if kw.get("batch_first") else (L, N, F_in)) if batched else (L, F_in)
    x = rng.standard_normal(shape)
    e_in, t_in = [E(x)], [T(x)]
    if with_hx:
        n_states = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
        hs = (n_states, N) if batched else (n_states,)
        h = rng.standard_normal(hs + (proj or hidden,))
        if kind == "LSTM":
            c = rng.standard_normal(hs + (hidden,))
            e_in += [E(h), E(c)]
            t_in += [T(h), T(c)]
        else:
            e_in.append(E(h))
            t_in.append(T(h))
    return e_in, t_in


def _rnn_call(kind: str) -> Any:
    def call(m: Any, xs: list[Any]) -> Any:
        if len(xs) == 1:
            return m(xs[0])
        return m(xs[0], (xs[1], xs[2])) if kind == "LSTM" else m(xs[0], xs[1])

    return call


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("kw", RNN_CASES)
@pytest.mark.parametrize("with_hx", [False, True])
def test_recurrent_vs_torch(kind: str, kw: dict[str, Any], with_hx: bool, rng: np.random.Generator) -> None:
    em_cls = {"LSTM": LSTM, "GRU": GRU, "RNN": RNN}[kind]
    em, tm = pair(em_cls, getattr(torch.nn, kind), 4, 6, **kw)
    e_in, t_in = _rnn_inputs(kind, kw, rng, True, with_hx, 6)
    compare(em, tm, e_in, t_in, _rnn_call(kind), rng)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("with_hx", [False, True])
def test_recurrent_unbatched(kind: str, with_hx: bool, rng: np.random.Generator) -> None:
    em_cls = {"LSTM": LSTM, "GRU": GRU, "RNN": RNN}[kind]
    kw = {"num_layers": 2, "bidirectional": True, "batch_first": True}
    em, tm = pair(em_cls, getattr(torch.nn, kind), 4, 5, **kw)
    e_in, t_in = _rnn_inputs(kind, kw, rng, False, with_hx, 5)
    compare(em, tm, e_in, t_in, _rnn_call(kind), rng)
    out = flat(_rnn_call(kind)(em, e_in))
    assert out[0].shape == (5, 10) and out[1].shape == (4, 5)


@pytest.mark.parametrize("with_hx", [False, True])
def test_lstm_proj_size(with_hx: bool, rng: np.random.Generator) -> None:
    kw = {"num_layers": 2, "bidirectional": True, "proj_size": 3}
    em, tm = pair(LSTM, torch.nn.LSTM, 4, 6, **kw)
    assert em.weight_hr_l1_reverse.shape == (3, 6) and em.weight_ih_l1.shape == (24, 6)
    e_in, t_in = _rnn_inputs("LSTM", kw, rng, True, with_hx, 6, proj=3)
    compare(em, tm, e_in, t_in, _rnn_call("LSTM"), rng)


def test_rnn_relu(rng: np.random.Generator) -> None:
    em, tm = pair(RNN, torch.nn.RNN, 4, 6, 2, "relu")
    assert "nonlinearity='relu'" in repr(em)
    e_in, t_in = _rnn_inputs("RNN", {"num_layers": 2}, rng, True, True, 6)
    compare(em, tm, e_in, t_in, _rnn_call("RNN"), rng)


def test_recurrent_dropout_between_layers(rng: np.random.Generator) -> None:
    # p = 1 zeroes the input of layer 2 deterministically, so the training-mode result must equal torch's
    em, tm = pair(LSTM, torch.nn.LSTM, 4, 5, num_layers=2, dropout=1.0, eval_mode=False)
    e_in, t_in = _rnn_inputs("LSTM", {"num_layers": 2}, rng, True, False, 5)
    compare(em, tm, e_in, t_in, _rnn_call("LSTM"), rng)
    # p = 0.5: random in training, identity in eval
    g = GRU(4, 5, num_layers=2, dropout=0.5, dtype=ember.float64, device=AD)
    x = E(rng.standard_normal((6, 3, 4)))
    assert not np.allclose(g(x)[0].numpy(), g(x)[0].numpy())
    g.eval()
    np.testing.assert_array_equal(g(x)[0].numpy(), g(x)[0].numpy())
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        LSTM(4, 5, dropout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LSTM(4, 5, num_layers=2, dropout=0.2)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [False, True])
def test_cells(kind: str, batched: bool, with_hx: bool, rng: np.random.Generator) -> None:
    em_cls = {"LSTMCell": LSTMCell, "GRUCell": GRUCell, "RNNCell": RNNCell}[kind]
    em, tm = pair(em_cls, getattr(torch.nn, kind), 4, 6)
    lead = (3,) if batched else ()
    x = rng.standard_normal(lead + (4,))
    e_in, t_in = [E(x)], [T(x)]
    if with_hx:
        for _ in range(2 if kind == "LSTMCell" else 1):
            h = rng.standard_normal(lead + (6,))
            e_in.append(E(h))
            t_in.append(T(h))

    def call(m: Any, xs: list[Any]) -> Any:
        if len(xs) == 1:
            return m(xs[0])
        return m(xs[0], (xs[1], xs[2])) if kind == "LSTMCell" else m(xs[0], xs[1])

    compare(em, tm, e_in, t_in, call, rng)


def test_recurrent_parameters_and_init() -> None:
    ember.manual_seed(3)
    m = LSTM(10, 20, num_layers=2, bidirectional=True)
    t = torch.nn.LSTM(10, 20, num_layers=2, bidirectional=True)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert [tuple(p.shape) for p in m.parameters()] == [tuple(p.shape) for p in t.parameters()]
    assert len(m.all_weights) == 4 and len(m.all_weights[0]) == 4
    allw = np.concatenate([p.numpy().ravel() for p in m.parameters()])
    bound = 1 / math.sqrt(20)
    assert np.abs(allw).max() <= bound and np.abs(allw).max() > 0.99 * bound
    assert abs(allw.mean()) < 0.01 and abs(allw.std() - bound / math.sqrt(3)) < 0.01
    g = GRU(3, 4, bias=False)
    assert [n for n, _ in g.named_parameters()] == ["weight_ih_l0", "weight_hh_l0"]
    assert g.weight_ih_l0.shape == (12, 3)
    c = LSTMCell(3, 4)
    assert [n for n, _ in c.named_parameters()] == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    assert repr(m) == "LSTM(10, 20, num_layers=2, bidirectional=True)"
    assert repr(GRU(3, 4, batch_first=True, bias=False)) == "GRU(3, 4, bias=False, batch_first=True)"
    m.flatten_parameters()  # accepted (no-op)


def test_recurrent_float32_smoke(rng: np.random.Generator) -> None:
    tm = torch.nn.GRU(4, 5, num_layers=2, bidirectional=True)
    em = GRU(4, 5, num_layers=2, bidirectional=True, device=AD)
    load(em, tm)
    x = rng.standard_normal((6, 2, 4)).astype(np.float32)
    out, h = em(E(x))
    ref, rh = tm(T(x))
    assert out.dtype == ember.float32
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.numpy(), rh.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_recurrent_module_to_device_and_dtype(rng: np.random.Generator) -> None:
    m = LSTM(3, 4)  # default device and dtype
    m.to(AD).double()
    x = E(rng.standard_normal((2, 1, 3)))
    out, (h, c) = m(x)
    out.sum().backward()
    assert out.dtype == ember.float64 and m.weight_ih_l0.grad is not None
    assert m.weight_ih_l0.grad.shape == (16, 3)


def test_recurrent_errors() -> None:
    f64 = {"dtype": ember.float64, "device": AD}
    m = LSTM(4, 5, num_layers=2, **f64)
    with pytest.raises(ShapeError, match=r"LSTM: input.size\(-1\) must be equal to input_size, expected 4, got 3"):
        m(ember.zeros(5, 2, 3, **f64))
    with pytest.raises(ShapeError, match=r"LSTM: expected input to be 2-D .* got 4-D shape \(1, 5, 2, 4\)"):
        m(ember.zeros(1, 5, 2, 4, **f64))
    with pytest.raises(ShapeError, match=r"LSTM: expected h_0 of size \(2, 2, 5\), got \(2, 3, 5\)"):
        m(ember.zeros(5, 2, 4, **f64), (ember.zeros(2, 3, 5, **f64), ember.zeros(2, 2, 5, **f64)))
    with pytest.raises(ShapeError, match=r"LSTM: expected c_0 of size \(2, 2, 5\), got \(1, 2, 5\)"):
        m(ember.zeros(5, 2, 4, **f64), (ember.zeros(2, 2, 5, **f64), ember.zeros(1, 2, 5, **f64)))
    with pytest.raises(ShapeError, match=r"for unbatched 2-D input, h_0 should also be 2-D but got 3-D"):
        m(ember.zeros(5, 4, **f64), (ember.zeros(2, 1, 5, **f64), ember.zeros(2, 1, 5, **f64)))
    with pytest.raises(DTypeError, match=r"LSTM: expected hx to be a tuple \(h_0, c_0\)"):
        m(ember.zeros(5, 2, 4, **f64), ember.zeros(2, 2, 5, **f64))
    with pytest.raises(ShapeError, match=r"sequence length larger than 0"):
        m(ember.zeros(0, 2, 4, **f64))
    g = GRU(4, 5, **f64)
    with pytest.raises(DTypeError, match=r"GRU: hx dtype float32 does not match input dtype float64"):
        g(ember.zeros(5, 2, 4, **f64), ember.zeros(1, 2, 5, device=AD))
    with pytest.raises(DTypeError, match=r"GRU: expected input to be a floating-point tensor, got dtype int64"):
        g(ember.zeros(5, 2, 4, dtype=ember.int64, device=AD))
    with pytest.raises(ValueRangeError, match="GRU: proj_size argument is only supported for LSTM"):
        RNNBase("GRU", 4, 5, proj_size=2)
    with pytest.raises(ValueRangeError, match=r"LSTM: proj_size has to be smaller than hidden_size"):
        LSTM(4, 5, proj_size=5)
    with pytest.raises(ValueRangeError, match="LSTM: dropout must be in"):
        LSTM(4, 5, num_layers=2, dropout=2.0)
    with pytest.raises(ValueRangeError, match="GRU: hidden_size must be positive, got 0"):
        GRU(4, 0)
    with pytest.raises(DTypeError, match="LSTM: num_layers must be an int, got float"):
        LSTM(4, 5, num_layers=1.5)
    with pytest.raises(ValueRangeError, match="RNN: unknown nonlinearity 'sigmoid'"):
        RNN(4, 5, nonlinearity="sigmoid")
    c = GRUCell(4, 5, **f64)
    with pytest.raises(ShapeError, match=r"GRUCell: expected input to be 1-D .* got 3-D"):
        c(ember.zeros(1, 2, 4, **f64))
    with pytest.raises(ShapeError, match=r"GRUCell: expected hx of shape \(2, 5\), got \(3, 5\)"):
        c(ember.zeros(2, 4, **f64), ember.zeros(3, 5, **f64))
    with pytest.raises(ShapeError, match=r"GRUCell: input has 3 features .* input_size=4"):
        c(ember.zeros(2, 3, **f64))


def test_load_mismatched_torch_weights_is_a_shape_error() -> None:
    t = torch.nn.LSTM(4, 6)
    m = LSTM(4, 5)
    with pytest.raises(ShapeError, match=r"weight_ih_l0: checkpoint shape \(24, 4\), model shape \(20, 4\)"):
        m.load_state_dict({k: ember.tensor(v.numpy()) for k, v in t.state_dict().items()})
    with pytest.raises(EmberError, match="missing keys"):
        MultiheadAttention(8, 2, kdim=4).load_state_dict(
            {k: ember.tensor(v.numpy()) for k, v in torch.nn.MultiheadAttention(8, 2).state_dict().items()})
