"""The flex kernels of core's attention ops (nn.scaled_dot_product_attention and its backward) against torch and
against the ops' compositions: no mask, bool and float masks (broadcast), is_causal (L != S too), scale=, GQA,
dropout (the composition's draw), broadcast batch dims, unbatched 2-D operands, float32 and float64, fused and
unfused devices, fully masked rows, the float mask's gradient, and MultiheadAttention / TransformerEncoderLayer
through the kernels; inference (no gradient can flow) through the output-only kernel, bit for bit the training
forward's output, eager and replayed. Every test checks the kernels really ran (a silent fall back to the
composition gives the same numbers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember.ops import attention as A

torch = pytest.importorskip("torch")
TF = torch.nn.functional

TOL = {"float32": {"rtol": 2e-5, "atol": 2e-6}, "float64": {"rtol": 1e-10, "atol": 1e-12}}
DEVICES = ["flex+autodiff", "flex+fusion(False)+autodiff"]


@pytest.fixture
def calls() -> Iterator[dict[str, int]]:
    """Count the kernels' calls (the originals are restored afterwards)."""
    ember.zeros(1)  # plugins load lazily: the flex kernels are registered once flex is loaded
    counts = {"forward": 0, "backward": 0, "out": 0}
    fwd, bwd, out = A.sdpa.kernels["flex"], A.sdpa_backward.kernels["flex"], A.sdpa_out.kernels["flex"]

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    A.sdpa.kernel("flex")(counting("forward", fwd))
    A.sdpa_backward.kernel("flex")(counting("backward", bwd))
    A.sdpa_out.kernel("flex")(counting("out", out))
    try:
        yield counts
    finally:
        A.sdpa.kernel("flex")(fwd)
        A.sdpa_backward.kernel("flex")(bwd)
        A.sdpa_out.kernel("flex")(out)


def _rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# (query, key, value, mask) shapes; mask None, or a shape broadcasting to the attention's
CASES = {
    "4d": ((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4), None),
    "L!=S,Ev": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), None),
    "3d": ((3, 4, 8), (3, 6, 8), (3, 6, 5), None),
    "2d": ((4, 8), (6, 8), (6, 3), None),
    "bcast-batch": ((1, 3, 5, 4), (2, 1, 7, 4), (2, 3, 7, 4), None),
    "v-wider-batch": ((3, 5, 4), (3, 7, 4), (2, 3, 7, 4), None),
    "mask-2d": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4), (5, 7)),
    "mask-kpm": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4), (2, 1, 1, 7)),
    "mask-full": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4), (2, 3, 5, 7)),
}


def _mask(rng: np.random.Generator, shape: tuple[int, ...], kind: str, dtype: str) -> np.ndarray:
    if kind == "bool":
        m = rng.random(shape) < 0.7
        m[..., 0] = True  # every row keeps one position (fully masked rows have their own test)
        return m
    return rng.standard_normal(shape).astype(dtype)


def _run(dev: str, dtype: str, shapes: tuple[Any, ...], mask_kind: str | None, seed: int = 0,
         **kw: Any) -> None:
    """Forward and backward of ember and torch on the same data; compares output and every gradient."""
    rng = np.random.default_rng(seed)
    qs, ks, vs, ms = shapes
    arrays = [_rand(rng, s, dtype) for s in (qs, ks, vs)]
    m = _mask(rng, ms, mask_kind, dtype) if ms is not None and mask_kind else None
    grad_mask = m is not None and m.dtype != np.bool_
    e_in = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    e_m = None if m is None else ember.tensor(m, device=dev, requires_grad=grad_mask)
    t_m = None if m is None else torch.tensor(m, requires_grad=grad_mask)
    e_out = F.scaled_dot_product_attention(*e_in, attn_mask=e_m, **kw)
    t_out = TF.scaled_dot_product_attention(*t_in, attn_mask=t_m, **kw)
    tol = TOL[dtype]
    assert tuple(e_out.shape) == tuple(t_out.shape)
    np.testing.assert_allclose(e_out.numpy(), t_out.detach().numpy(), **tol)
    g = rng.standard_normal(tuple(t_out.shape)).astype(dtype)
    (e_out * ember.tensor(g, device=dev)).sum().backward()
    (t_out * torch.tensor(g)).sum().backward()
    for name, e, t in zip("qkv", e_in, t_in):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **tol, err_msg=f"d{name}")
    if grad_mask:
        np.testing.assert_allclose(e_m.grad.numpy(), t_m.grad.numpy(), **tol, err_msg="dmask")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,mask_kind", [(c, k) for c, s in CASES.items()
                                             for k in ([None] if s[3] is None else ["bool", "float"])])
def test_against_torch(calls: dict[str, int], dev: str, dtype: str, case: str, mask_kind: str | None) -> None:
    _run(dev, dtype, CASES[case], mask_kind)
    assert calls == {"forward": 1, "backward": 1, "out": 0}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("L,S", [(5, 5), (5, 8), (8, 5)])
def test_causal_and_scale(calls: dict[str, int], dev: str, dtype: str, L: int, S: int) -> None:
    # top-left aligned triangle as torch; with L > S the last rows see every key
    _run(dev, dtype, ((2, 3, L, 4), (2, 3, S, 4), (2, 3, S, 6), None), None, is_causal=True)
    _run(dev, dtype, ((2, 3, L, 4), (2, 3, S, 4), (2, 3, S, 6), None), None, scale=0.3, seed=1)
    assert calls == {"forward": 2, "backward": 2, "out": 0}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gqa(calls: dict[str, int], dev: str, dtype: str) -> None:
    _run(dev, dtype, ((2, 6, 5, 4), (2, 2, 7, 4), (2, 3, 7, 5), None), None, enable_gqa=True)
    _run(dev, dtype, ((2, 6, 5, 4), (2, 3, 7, 4), (2, 3, 7, 5), (5, 7)), "bool", enable_gqa=True, is_causal=False)
    assert calls == {"forward": 2, "backward": 2, "out": 0}


@pytest.mark.parametrize("dev", DEVICES)
def test_fully_masked_rows_give_zeros(calls: dict[str, int], dev: str) -> None:
    """torch's math path: a row without any kept position gives zeros and zero gradients (no NaN)."""
    rng = np.random.default_rng(3)
    q, k, v = (_rand(rng, s, "float64") for s in ((2, 4, 3), (2, 5, 3), (2, 5, 3)))
    keep = np.ones((4, 5), bool)
    keep[1] = False
    e_in = [ember.tensor(a, device=dev, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*e_in, attn_mask=ember.tensor(keep, device=dev))
    ref = TF.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), attn_mask=torch.tensor(keep))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), **TOL["float64"])
    assert np.all(out.numpy()[:, 1] == 0)
    out.sum().backward()
    assert np.all(np.isfinite(e_in[0].grad.numpy())) and np.all(e_in[0].grad.numpy()[:, 1] == 0)
    # a -inf float mask row too
    fm = np.where(keep, 0.0, -np.inf)
    out2 = F.scaled_dot_product_attention(*e_in, attn_mask=ember.tensor(fm, device=dev))
    np.testing.assert_allclose(out2.numpy(), out.numpy(), rtol=0, atol=0)
    assert calls == {"forward": 2, "backward": 1, "out": 0}


@pytest.mark.parametrize("mask_kind", [None, "bool", "float", "causal"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dropout", [False, True])
def test_kernels_match_compositions(mask_kind: str | None, dtype: str, dropout: bool) -> None:
    """The op and its backward through the flex kernels equal their ember-ops compositions."""
    dev = ember.Device.parse("flex")
    rng = np.random.default_rng(4)
    q, k, v = (ember.tensor(_rand(rng, s, dtype), device=dev) for s in ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6)))
    m = None if mask_kind in (None, "causal") else ember.tensor(_mask(rng, (5, 7), mask_kind, dtype), device=dev)
    drop = ember.tensor(((rng.random((2, 3, 5, 7)) < 0.7) / 0.7).astype(dtype), device=dev) if dropout else None
    kw = {"scale": 0.4, "is_causal": mask_kind == "causal", "mask_grad": mask_kind == "float"}
    got, want = A.sdpa(q, k, v, m, drop, **kw), A.sdpa.composition(q, k, v, m, drop, **kw)
    tol = TOL[dtype]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), **tol)
    dout = ember.tensor(_rand(rng, (2, 3, 5, 6), dtype), device=dev)
    b_got = A.sdpa_backward(q, k, v, m, drop, got[0], got[1], dout, **kw)
    b_want = A.sdpa_backward.composition(q, k, v, m, drop, got[0], got[1], dout, **kw)
    assert len(b_got) == len(b_want) == (4 if mask_kind == "float" else 3)
    for a, b in zip(b_got, b_want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a.numpy(), b.numpy(), **tol)


def test_half_dtypes_compute_in_float32(calls: dict[str, int]) -> None:
    rng = np.random.default_rng(5)
    arrays = [_rand(rng, (2, 5, 8), "float32") for _ in range(3)]
    for name in ("float16", "bfloat16"):
        e = F.scaled_dot_product_attention(*(ember.tensor(a, device="flex").to(getattr(ember, name))
                                             for a in arrays))
        t = TF.scaled_dot_product_attention(*(torch.tensor(a).to(getattr(torch, name)) for a in arrays))
        assert e.dtype is getattr(ember, name)
        np.testing.assert_allclose(e.to(ember.float32).numpy(), t.float().numpy(), rtol=2e-2, atol=2e-2)
    assert calls == {"forward": 0, "backward": 0, "out": 2}  # no grad: the output-only kernel


def test_errors_unchanged() -> None:
    dev = "flex"
    q = ember.zeros(2, 4, 8, device=dev)
    with pytest.raises(ember.ShapeError, match="same embedding size"):
        F.scaled_dot_product_attention(q, ember.zeros(2, 4, 6, device=dev), q)
    with pytest.raises(ember.ShapeError, match="same sequence length"):
        F.scaled_dot_product_attention(q, q, ember.zeros(2, 5, 8, device=dev))
    with pytest.raises(ember.ValueRangeError, match="is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ember.ones(4, 4, dtype=ember.bool_, device=dev),
                                       is_causal=True)
    with pytest.raises(ember.DTypeError, match="attn_mask dtype"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ember.ones(4, 4, dtype=ember.int64, device=dev))
    with pytest.raises(ember.ShapeError, match="does not broadcast"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ember.ones(3, 4, dtype=ember.bool_, device=dev))
    # the op's own shape rule names it (it runs before any kernel)
    with pytest.raises(ember.ShapeError, match="nn.scaled_dot_product_attention"):
        A.sdpa(q, ember.zeros(2, 5, 6, device=dev), q, None, None, scale=1.0)


def test_dropout_one_and_empty_use_the_composition(calls: dict[str, int]) -> None:
    q = ember.ones(2, 4, 8, device="flex")
    assert np.all(F.scaled_dot_product_attention(q, q, q, dropout_p=1.0).numpy() == 0)
    empty = F.scaled_dot_product_attention(ember.ones(2, 0, 8, device="flex"), q, q)
    assert empty.shape == (2, 0, 8)
    assert calls == {"forward": 0, "backward": 0, "out": 0}


@pytest.mark.parametrize("dev", DEVICES)
def test_dropout_draws_as_the_composition(calls: dict[str, int], dev: str) -> None:
    """dropout_p > 0 runs the kernel with the same draw from the device's stream as the ops composition (same
    seed, same numbers), and its gradients are those of (softmax(...) * factors) @ v."""
    from ember.ops import nn as N

    device = ember.Device.parse(dev)
    rng = np.random.default_rng(7)
    arrays = [_rand(rng, s, "float64") for s in ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6))]
    e_in = [ember.tensor(a, device=device, requires_grad=True) for a in arrays]
    device.seed(11)
    got = F.scaled_dot_product_attention(*e_in, dropout_p=0.4, is_causal=True)
    device.seed(11)
    with ember.no_grad():
        want = N.scaled_dot_product_attention(*e_in, None, 0.4, True, 0.5, 1, 1, (2, 3, 5, 6))
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL["float64"])
    assert calls["forward"] == 1
    # gradients against torch with the same factors (recovered from the draw: keep where rand < 1 - p)
    device.seed(11)
    factors = (ember.rand((2, 3, 5, 7), dtype=ember.float64, device=device).numpy() < 0.6) / 0.6
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    scores = t_in[0] @ t_in[1].transpose(-2, -1) * 0.5
    scores = scores.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), float("-inf"))
    ref = (torch.softmax(scores, -1) * torch.tensor(factors)) @ t_in[2]
    np.testing.assert_allclose(got.numpy(), ref.detach().numpy(), **TOL["float64"])
    g = rng.standard_normal((2, 3, 5, 6))
    (got * ember.tensor(g, device=device)).sum().backward()
    (ref * torch.tensor(g)).sum().backward()
    for e, t in zip(e_in, t_in):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **TOL["float64"])
    assert calls == {"forward": 1, "backward": 1, "out": 0}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_through_the_kernels(calls: dict[str, int], dev: str, batch_first: bool) -> None:
    """A pre-norm GELU encoder layer (the seed transformer's) with a key padding mask, against torch's."""
    rng = np.random.default_rng(6)
    tl = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", batch_first=batch_first,
                                          norm_first=True, dtype=torch.float64)
    el = ember.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", batch_first=batch_first,
                                          norm_first=True, dtype=ember.float64, device=dev)
    el.load_state_dict({k: ember.tensor(v.detach().numpy(), device=dev) for k, v in tl.state_dict().items()})
    x = rng.standard_normal((3, 6, 16) if batch_first else (6, 3, 16))
    kpm = np.zeros((3, 6), bool)
    kpm[0, 4:] = True
    ex, tx = ember.tensor(x, device=dev, requires_grad=True), torch.tensor(x, requires_grad=True)
    e_out = el(ex, src_key_padding_mask=ember.tensor(kpm, device=dev))
    t_out = tl(tx, src_key_padding_mask=torch.tensor(kpm))
    np.testing.assert_allclose(e_out.numpy(), t_out.detach().numpy(), **TOL["float64"])
    e_out.sum().backward()
    t_out.sum().backward()
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), **TOL["float64"])
    tp = dict(tl.named_parameters())
    for name, p in el.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tp[name].grad.numpy(), **TOL["float64"], err_msg=name)
    assert calls == {"forward": 1, "backward": 1, "out": 0}


def test_inference_runs_the_forward_kernel_only(calls: dict[str, int]) -> None:
    m = ember.nn.MultiheadAttention(8, 2, batch_first=True, device="flex")
    x = ember.ones(2, 5, 8, device="flex")
    with ember.no_grad():
        out, w = m(x, x, x, need_weights=False)
    assert out.shape == (2, 5, 8) and w is None
    assert calls == {"forward": 0, "backward": 0, "out": 1}


# -- inference: the output-only op (nn.scaled_dot_product_attention_out) ------------------------------------------
# (device, how no gradient can flow): a device without autodiff; autodiff under no_grad; autodiff with operands that
# do not require grad; the fused device
INFERENCE = [("flex", "plain"), ("flex+autodiff", "no_grad"), ("flex+autodiff", "no_requires_grad"),
             ("flex+fusion(False)+autodiff", "no_grad"), ("flex+fusion", "plain")]


def _inference(dev: str, how: str, arrays: list[np.ndarray], m: np.ndarray | None, **kw: Any) -> np.ndarray:
    e_in = [ember.tensor(a, device=dev, requires_grad=how == "no_grad") for a in arrays]
    e_m = None if m is None else ember.tensor(m, device=dev)
    if how == "no_grad":
        with ember.no_grad():
            return F.scaled_dot_product_attention(*e_in, attn_mask=e_m, **kw).numpy()
    return F.scaled_dot_product_attention(*e_in, attn_mask=e_m, **kw).numpy()


@pytest.mark.parametrize("dev,how", INFERENCE)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inference_runs_the_output_only_kernel(calls: dict[str, int], dev: str, how: str, dtype: str) -> None:
    """No gradient can flow: the output-only kernel runs (never the forward that keeps the weights), with torch's
    numbers and exactly the bits of the training forward's output; every shape case, bool and float masks."""
    rng = np.random.default_rng(12)
    cases = [(c, k) for c, s in CASES.items() for k in ([None] if s[3] is None else ["bool", "float"])]
    for n, (case, mask_kind) in enumerate(cases, 1):
        qs, ks, vs, ms = CASES[case]
        arrays = [_rand(rng, s, dtype) for s in (qs, ks, vs)]
        m = _mask(rng, ms, mask_kind, dtype) if ms is not None and mask_kind else None
        got = _inference(dev, how, arrays, m)
        want = TF.scaled_dot_product_attention(*(torch.tensor(a) for a in arrays),
                                               attn_mask=None if m is None else torch.tensor(m))
        np.testing.assert_allclose(got, want.numpy(), **TOL[dtype], err_msg=f"{case} {mask_kind}")
        assert calls == {"forward": n - 1, "backward": 0, "out": n}, (case, mask_kind)
        tracked = F.scaled_dot_product_attention(
            *(ember.tensor(a, device="flex+autodiff", requires_grad=True) for a in arrays),
            attn_mask=None if m is None else ember.tensor(m, device="flex+autodiff"))
        assert calls == {"forward": n, "backward": 0, "out": n}, (case, mask_kind)
        assert np.array_equal(got, tracked.numpy()), (case, mask_kind)  # the same blocks and arithmetic


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("kw", [{"is_causal": True}, {"enable_gqa": True}, {"scale": 0.3, "is_causal": True}],
                         ids=["causal", "gqa", "scale-causal"])
def test_inference_causal_gqa_and_dtypes(calls: dict[str, int], dtype: str, kw: dict[str, Any]) -> None:
    rng = np.random.default_rng(13)
    shapes = ((2, 6, 9, 4), (2, 2, 11, 4), (2, 3, 11, 5)) if kw.get("enable_gqa") else \
        ((2, 3, 9, 4), (2, 3, 11, 4), (2, 3, 11, 5))
    arrays = [_rand(rng, s, "float32") for s in shapes]
    e_in = [ember.tensor(a, device="flex").to(getattr(ember, dtype)) for a in arrays]
    t_in = [torch.tensor(a).to(getattr(torch, dtype)) for a in arrays]
    got = F.scaled_dot_product_attention(*e_in, **kw)
    assert got.dtype is getattr(ember, dtype) and calls["out"] == 1
    want = TF.scaled_dot_product_attention(*t_in, **kw)
    tol = TOL.get(dtype, {"rtol": 2e-2, "atol": 2e-2})
    np.testing.assert_allclose(got.to(ember.float64).numpy(), want.double().numpy(), **tol)
    # the training forward's output, bit for bit (half dtypes: the same float32 work, rounded once)
    sc = kw.get("scale", 0.5)
    rk = rv = 1
    if kw.get("enable_gqa"):
        rk, rv = 3, 2
    full = A.sdpa(*e_in, None, None, scale=sc, is_causal=kw.get("is_causal", False), repeat_k=rk, repeat_v=rv)[0]
    assert np.array_equal(got.to(ember.float64).numpy(), full.to(ember.float64).numpy())


def test_a_mask_that_requires_grad_keeps_the_training_forward(calls: dict[str, int]) -> None:
    """Only the float mask requires grad: gradient flows to it, so the weights are kept and its gradient is torch's."""
    rng = np.random.default_rng(14)
    arrays = [_rand(rng, s, "float64") for s in ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4))]
    m = _rand(rng, (5, 7), "float64")
    e_m, t_m = ember.tensor(m, device="flex+autodiff", requires_grad=True), torch.tensor(m, requires_grad=True)
    e = F.scaled_dot_product_attention(*(ember.tensor(a, device="flex+autodiff") for a in arrays), attn_mask=e_m)
    t = TF.scaled_dot_product_attention(*(torch.tensor(a) for a in arrays), attn_mask=t_m)
    e.sum().backward()
    t.sum().backward()
    np.testing.assert_allclose(e_m.grad.numpy(), t_m.grad.numpy(), **TOL["float64"])
    assert calls == {"forward": 1, "backward": 1, "out": 0}


def test_need_weights_still_gets_the_weights(calls: dict[str, int]) -> None:
    """MultiheadAttention(need_weights=True) under no_grad returns torch's averaged and per-head weights."""
    rng = np.random.default_rng(15)
    tm = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    em = ember.nn.MultiheadAttention(8, 2, batch_first=True, dtype=ember.float64, device="flex")
    em.load_state_dict({k: ember.tensor(v.detach().numpy(), device="flex") for k, v in tm.state_dict().items()})
    x = rng.standard_normal((2, 5, 8))
    ex, tx = ember.tensor(x, device="flex"), torch.tensor(x)
    for average in (True, False):
        with ember.no_grad(), torch.no_grad():
            eo, ew = em(ex, ex, ex, need_weights=True, average_attn_weights=average)
            to, tw = tm(tx, tx, tx, need_weights=True, average_attn_weights=average)
        np.testing.assert_allclose(eo.numpy(), to.numpy(), **TOL["float64"])
        assert ew is not None
        np.testing.assert_allclose(ew.numpy(), tw.numpy(), **TOL["float64"])
    with ember.no_grad():
        eo2, none = em(ex, ex, ex, need_weights=False)
    assert none is None and calls["out"] == 1
    np.testing.assert_allclose(eo2.numpy(), eo.numpy(), **TOL["float64"])


def test_inference_replay_is_bit_identical_to_eager(calls: dict[str, int]) -> None:
    """An encoder layer's inference forward through ember.compile's replay: eager's bits, the output-only kernel."""
    dev = ember.Device.parse("flex")
    layer = ember.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True, device=dev)
    layer.eval()
    rng = np.random.default_rng(16)
    xs = [ember.tensor(rng.standard_normal((3, 24, 16)).astype(np.float32), device=dev) for _ in range(3)]

    def fwd(x: Any) -> Any:
        with ember.no_grad():
            return layer(x, is_causal=True)

    eager = [fwd(x).numpy() for x in xs]
    f = ember.compile(fwd)
    replayed = [f(x).numpy() for x in xs]
    assert f.stats()["replays"] >= 1
    assert calls["forward"] == 0 and calls["out"] >= len(xs) + 1
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed, strict=True))
