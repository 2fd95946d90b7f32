"""ember.quantization through its compositions (the "toy" backend has no kernels; the flex kernels are tested in
ember-flex's tests/test_quant_kernels.py).

NF4/FP4 are checked bit for bit against a numpy reference written here from bitsandbytes' published algorithm
(``quantize_4bit`` / ``dequantize_4bit``, blocksize 64): per block the absmax, values multiplied by the float32
reciprocal of it (0 for an all-zero block), the code chosen by bitsandbytes' decision thresholds (NF4: the float32
midpoints of its 16-value codebook, ``x > t`` picks the upper code so a tie goes to the lower one; FP4: its
published tree over the magnitude, bit 3 the sign), two codes per byte with the first in the high nibble, the
last partial block's absmax over its own elements and an odd last byte's low nibble the code of 0.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device, nn
from ember import quantization as Q
from ember.errors import DTypeError, ShapeError, ValueRangeError
from ember.quantization import ops

torch = pytest.importorskip("torch")

TOY = "toy"

# -- the reference (bitsandbytes' published algorithm) -----------------------------------------------------------------
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)
FP4 = np.array([0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25,
                -0.0, -0.005208333333, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667, -0.25], dtype=np.float32)
NF4_MIDS = ((NF4[:-1].astype(np.float64) + NF4[1:].astype(np.float64)) / 2).astype(np.float32)


def _fp4_code(v: float) -> int:
    """bitsandbytes' FP4 decision tree (the constants as published)."""
    sign = 8 if v < 0 else 0
    a = abs(v)
    f = np.float32
    if a > f(0.29166667):
        if a > f(0.583333):
            return (3 if a > f(0.8333333) else 2) + sign
        return (5 if a > f(0.4166667) else 4) + sign
    if a > f(0.0859375):
        return (7 if a > f(0.20833333) else 6) + sign
    return (1 if a > f(0.00260417) else 0) + sign


def ref_quantize(x: np.ndarray, quant_type: str, blocksize: int = 64) -> tuple[np.ndarray, np.ndarray]:
    flat = x.astype(np.float32).reshape(-1)
    n = flat.size
    nb = -(-n // blocksize)
    absmax = np.empty(nb, np.float32)
    codes = np.empty(n + (n % 2), np.uint8)
    for b in range(nb):
        blk = flat[b * blocksize:(b + 1) * blocksize]
        m = np.float32(np.abs(blk).max())
        absmax[b] = m
        r = np.float32(1) / m if m else np.float32(0)
        scaled = blk * r
        if quant_type == "nf4":
            c = np.array([int(np.sum(v > NF4_MIDS)) for v in scaled], np.uint8)
        else:
            c = np.array([_fp4_code(float(v)) for v in scaled], np.uint8)
        codes[b * blocksize:b * blocksize + blk.size] = c
    if n % 2:
        codes[-1] = 7 if quant_type == "nf4" else 0  # the code of 0.0
    return ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8), absmax


def ref_dequantize(packed: np.ndarray, absmax: np.ndarray, n: int, quant_type: str, blocksize: int = 64) -> np.ndarray:
    book = NF4 if quant_type == "nf4" else FP4
    codes = np.stack([packed >> 4, packed & 15], 1).reshape(-1)[:n]
    return book[codes] * np.repeat(absmax, blocksize)[:n]


def t(a: np.ndarray, dev: str = TOY, **kw: Any) -> ember.Tensor:
    return ember.tensor(a, device=Device.parse(dev), **kw)


# -- NF4 / FP4 ---------------------------------------------------------------------------------------------------------
def test_reference_constants_are_the_published_ones() -> None:
    assert np.array_equal(ops.CODEBOOKS["nf4"], NF4.astype(np.float64)) or \
        np.array_equal(np.float32(ops.CODEBOOKS["nf4"]), NF4)
    # bitsandbytes' NF4 decision constants are the codebook's midpoints
    assert np.array_equal(np.float32(ops.THRESHOLDS["nf4"]), NF4_MIDS)
    assert np.array_equal(np.float32(ops.CODEBOOKS["fp4"]), FP4)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("shape", [(64, 32), (4096,), (3, 7), (5, 33)], ids=["64x32", "4096", "3x7", "5x33"])
def test_4bit_bit_exact_with_reference(quant_type: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    q = Q.quantize(t(x), quant_type)
    packed, absmax = ref_quantize(x, quant_type)
    n = x.size
    assert np.array_equal(q.data.numpy()[:packed.size], packed)
    assert np.array_equal(q.scale.numpy()[:absmax.size], absmax)
    assert q.data.numpy().size == absmax.size * 32  # whole blocks are stored (padding past the real elements)
    back = q.dequantize().numpy()
    assert back.shape == shape and back.dtype == np.float32
    assert np.array_equal(back.reshape(-1), ref_dequantize(packed, absmax, n, quant_type))


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_ties_go_to_the_lower_code(quant_type: str) -> None:
    # a block whose absmax is 1 scales by exactly 1: each threshold itself, and the next float above it
    thr = np.float32(ops.THRESHOLDS[quant_type])
    vals = np.concatenate([[1.0], thr, np.nextafter(thr, np.float32(np.inf))]).astype(np.float32)
    x = np.zeros(64, np.float32)
    x[:vals.size] = vals
    q = Q.quantize(t(x), quant_type)
    packed, _ = ref_quantize(x, quant_type)
    assert np.array_equal(q.data.numpy(), packed)
    codes = np.stack([packed >> 4, packed & 15], 1).reshape(-1)[1:1 + 2 * thr.size]
    at, above = codes[:thr.size], codes[thr.size:]
    if quant_type == "nf4":
        assert list(at) == list(range(15)) and list(above) == list(range(1, 16))
    else:
        order = list(ops.FP4_ORDER)
        assert list(at) == order[:7] and list(above) == order[1:]


def test_4bit_edge_values() -> None:
    x = np.zeros((2, 64), np.float32)  # an all-zero block, then one with a negative absmax element and -0.0
    x[1, :4] = [-2.0, 1.0, -0.0, 0.5]
    for qt in ("nf4", "fp4"):
        q = Q.quantize(t(x), qt)
        packed, absmax = ref_quantize(x, qt)
        assert np.array_equal(q.data.numpy(), packed) and np.array_equal(q.scale.numpy(), absmax)
        assert np.array_equal(q.dequantize().numpy(), ref_dequantize(packed, absmax, x.size, qt).reshape(2, 64))
    assert Q.quantize(t(x), "nf4").dequantize().numpy()[0].tolist() == [0.0] * 64


@pytest.mark.parametrize("blocksize", [32, 128, 4096])
def test_4bit_block_sizes(blocksize: int) -> None:
    x = np.random.default_rng(2).standard_normal(4096 + 5).astype(np.float32)
    q = Q.quantize(t(x), "nf4", blocksize=blocksize)
    packed, absmax = ref_quantize(x, "nf4", blocksize)
    assert np.array_equal(q.data.numpy()[:packed.size], packed) and np.array_equal(q.scale.numpy(), absmax)


def test_nf4_rmse_on_gaussian() -> None:
    # bitsandbytes: about 0.092 at block size 64 on N(0, 1) (4096x4096; a smaller matrix here)
    x = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    q = Q.quantize(t(x), "nf4")
    rmse = float(np.sqrt(np.mean((q.dequantize().numpy() - x) ** 2)))
    assert 0.088 < rmse < 0.096


def test_input_dtypes_quantize_their_float32_values() -> None:
    x = np.random.default_rng(4).standard_normal(128)
    for d in (ember.float64, ember.bfloat16, ember.float16):
        xt = t(x).to(d)
        q = Q.quantize(xt, "nf4")
        ref, absmax = ref_quantize(xt.to(ember.float32).numpy(), "nf4")
        assert np.array_equal(q.data.numpy(), ref) and np.array_equal(q.scale.numpy(), absmax)
        assert q.dequantize().dtype is d and q.dtype is d
        assert q.dequantize(ember.float32).dtype is ember.float32


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_double_quant(quant_type: str) -> None:
    x = np.random.default_rng(5).standard_normal((300, 64)).astype(np.float32)  # 300 blocks: two DQ blocks
    plain = Q.quantize(t(x), quant_type)
    dq = Q.quantize(t(x), quant_type, double_quant=True)
    assert dq.double_quant and not plain.double_quant
    assert np.array_equal(dq.data.numpy(), plain.data.numpy())  # the 4-bit codes do not change
    assert dq.scale.dtype is ember.int8 and dq.scale.numel() == 512 and dq.scale2.numel() == 2
    absmax = plain.scale.numpy()
    # reference: mean removed, int8 absmax-symmetric per block of 256
    off = np.float32(absmax.mean())
    c = np.zeros(512, np.float32)
    c[:300] = absmax - off
    c = c.reshape(2, 256)
    s2 = np.abs(c).max(1)
    codes = np.clip(np.round(c / (s2 / 127)[:, None]), -127, 127)
    assert np.array_equal(dq.scale.numpy().reshape(2, 256), codes.astype(np.int8))
    got = dq.absmax().numpy()
    assert np.allclose(got, (codes * (s2 / 127)[:, None]).reshape(-1)[:300] + off, rtol=1e-6, atol=1e-7)
    assert np.abs(got - absmax).max() <= s2.max() / 127 / 2 * 1.001
    assert dq.nbytes() < plain.nbytes()
    assert np.abs(dq.dequantize().numpy() - plain.dequantize().numpy()).max() < 0.01


# -- int8 --------------------------------------------------------------------------------------------------------------
def _ref_int8(x: np.ndarray, scheme: str, reduce: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray, Any]:
    kw = {"axis": reduce, "keepdims": True} if reduce is not None else {}
    hi, lo = x.max(**kw), x.min(**kw)
    if scheme == "symmetric":
        amax = np.maximum(np.abs(hi), np.abs(lo))
        scale = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
        return np.clip(np.round(x / scale), -127, 127).astype(np.int8), scale, None
    hi, lo = np.maximum(hi, 0), np.minimum(lo, 0)
    scale = np.where(hi - lo > 0, (hi - lo) / np.float32(255), np.float32(1)).astype(np.float32)
    zp = np.clip(-128 - np.round(lo / scale), -128, 127)
    return np.clip(np.round(x / scale) + zp, -128, 127).astype(np.int8), scale, zp.astype(np.int8)


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("gran", ["per_tensor", "per_channel0", "per_channel1"])
def test_int8_modes(scheme: str, gran: str) -> None:
    x = (np.random.default_rng(6).standard_normal((6, 10)) * 2 + 0.5).astype(np.float32)
    reduce = {"per_tensor": None, "per_channel0": (1,), "per_channel1": (0,)}[gran]
    kw = {"granularity": "per_tensor"} if gran == "per_tensor" else \
        {"granularity": "per_channel", "axis": int(gran[-1])}
    q = Q.quantize(t(x), "int8", scheme=scheme, **kw)
    ref_q, scale, zp = _ref_int8(x, scheme, reduce)
    assert q.data.dtype is ember.int8 and np.array_equal(q.data.numpy(), ref_q)
    assert np.allclose(q.scale.numpy(), scale, rtol=1e-7)
    if zp is not None:
        assert np.array_equal(q.zero_point.numpy(), zp)
    back = q.dequantize().numpy()
    assert np.all(np.abs(back - x) <= np.broadcast_to(scale, x.shape) * 0.5 + 1e-6)


def test_int8_per_block_and_asymmetric_range() -> None:
    x = np.random.default_rng(7).standard_normal(200).astype(np.float32)
    q = Q.quantize(t(x), "int8", granularity="per_block", blocksize=64)
    blocks = np.zeros(256, np.float32)
    blocks[:200] = x
    blocks = blocks.reshape(4, 64)
    scale = np.abs(blocks).max(1) / np.float32(127)
    assert np.allclose(q.scale.numpy(), scale, rtol=1e-7)
    want = np.clip(np.round(blocks / scale[:, None]), -127, 127).astype(np.int8).reshape(-1)
    assert np.array_equal(q.data.numpy(), want)
    assert np.abs(q.dequantize().numpy() - x).max() <= scale.max() / 2 + 1e-6
    pos = np.linspace(1, 5, 20, dtype=np.float32)  # all positive: the range still includes 0 (zero is exact)
    qa = Q.quantize(t(pos), "int8", scheme="asymmetric")
    assert int(qa.zero_point.item()) == -128 and abs(float(qa.dequantize()[0]) - 1.0) < 0.02
    z = Q.quantize(t(np.zeros(4, np.float32)), "int8")
    assert z.scale.item() == 1.0 and z.dequantize().tolist() == [0.0] * 4


# -- bad inputs --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,err", [
    ({"format": "nf4", "blocksize": 48}, ValueRangeError), ({"format": "nf4", "blocksize": 16}, ValueRangeError),
    ({"format": "nf4", "blocksize": 8192}, ValueRangeError),
    ({"format": "fp4", "blocksize": True}, ValueRangeError),
    ({"format": "nf3"}, ValueRangeError), ({"format": "nf4", "double_quant": 1}, DTypeError),
    ({"format": "int8", "scheme": "affine"}, ValueRangeError),
    ({"format": "int8", "granularity": "row"}, ValueRangeError),
    ({"format": "int8", "granularity": "per_block", "scheme": "asymmetric"}, ValueRangeError),
    ({"format": "int8", "granularity": "per_block", "blocksize": 100}, ValueRangeError),
    ({"format": "int8", "granularity": "per_channel", "axis": 2}, ValueRangeError),
], ids=["bs48", "bs16", "bs8192", "bs-bool", "nf3", "dq-int", "scheme", "granularity", "block-asym", "block-100",
        "axis"])
def test_bad_options(kw: dict[str, Any], err: type) -> None:
    fmt = kw.pop("format")
    with pytest.raises(err):
        Q.quantize(t(np.ones((4, 4), np.float32)), fmt, **kw)


def test_bad_tensors() -> None:
    with pytest.raises(DTypeError, match="floating-point"):
        Q.quantize(t(np.ones(64, np.int32)), "nf4")
    with pytest.raises(ShapeError, match="empty"):
        Q.quantize(t(np.ones(0, np.float32)), "int8")
    with pytest.raises(DTypeError, match="Tensor"):
        Q.quantize(np.ones(64, np.float32), "nf4")  # type: ignore[arg-type]
    q = Q.quantize(t(np.ones(64, np.float32)), "nf4")
    with pytest.raises(DTypeError, match="floating-point"):
        q.dequantize(ember.int32)
    with pytest.raises(DTypeError):
        Q.dequantize(t(np.ones(3, np.float32)))  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="whole blocks"):
        ops.quantize_4bit(t(np.ones(65, np.float32)), blocksize=64, quant_type="nf4")
    with pytest.raises(DTypeError, match="uint8"):
        ops.dequantize_4bit(q.data.to(ember.int32), q.scale, blocksize=64, quant_type="nf4")
    with pytest.raises(ShapeError, match="blocks"):
        ops.dequantize_4bit(q.data, q.scale, blocksize=32, quant_type="nf4")
    with pytest.raises(ShapeError, match=r"\(\.\.\., 8\)"):
        ops.matmul_4bit(t(np.ones((2, 7), np.float32)), q.data, q.scale, None, out_features=8, in_features=8,
                        blocksize=64, quant_type="nf4")
    with pytest.raises(ShapeError, match="do not hold"):
        ops.matmul_4bit(t(np.ones((2, 8), np.float32)), q.data, q.scale, None, out_features=16, in_features=8,
                        blocksize=64, quant_type="nf4")


# -- on-the-fly matmul and Linear4bit vs torch -------------------------------------------------------------------------
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear4bit_forward_backward_vs_torch(quant_type: str, bias: bool) -> None:
    dev = Device.parse("toy+autodiff")
    rng = np.random.default_rng(8)
    lin = nn.Linear(40, 24, bias=bias, device=dev)
    layer = Q.Linear4bit.from_linear(lin, quant_type, blocksize=32)
    if bias:
        layer.bias.requires_grad_(True)
    w = layer.quantized_weight().dequantize().numpy()
    x = rng.standard_normal((3, 5, 40)).astype(np.float32)
    ex = ember.tensor(x, device=dev, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w)
    tb = torch.tensor(lin.bias.detach().numpy(), requires_grad=True) if bias else None
    y = layer(ex)
    ty = torch.nn.functional.linear(tx, tw, tb)
    assert y.dtype is ember.float32 and tuple(y.shape) == (3, 5, 24)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal((3, 5, 24)).astype(np.float32)
    y.backward(ember.tensor(g, device=dev))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    if bias:
        np.testing.assert_allclose(layer.bias.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert all(b.grad is None for b in layer.buffers())


def test_linear4bit_bfloat16_and_double_quant() -> None:
    dev = Device.parse("toy+autodiff")
    lin = nn.Linear(64, 16, device=dev)
    layer = Q.Linear4bit.from_linear(lin, "nf4", double_quant=True, compute_dtype=ember.bfloat16)
    x = ember.randn(4, 64, device=dev)
    assert layer(x.to(ember.bfloat16)).dtype is ember.bfloat16
    y = layer(x)
    assert y.dtype is ember.float32  # computed in bfloat16, returned in the input's dtype (as bitsandbytes)
    ref = x.numpy() @ layer.quantized_weight().dequantize().numpy().T + lin.bias.detach().numpy()
    np.testing.assert_allclose(y.to(ember.float32).numpy(), ref, rtol=3e-2, atol=3e-2)
    assert "double_quant=True" in repr(layer)
    back = layer.dequantized_linear()
    assert isinstance(back, nn.Linear) and back.weight.dtype is ember.float32
    with pytest.raises(DTypeError):
        Q.Linear4bit.from_linear(nn.Conv2d(1, 1, 1))  # type: ignore[arg-type]


# -- quantize_dynamic --------------------------------------------------------------------------------------------------
def test_quantize_dynamic_matches_reference_and_reports_size() -> None:
    dev = Device.parse(TOY)
    model = nn.Sequential(nn.Linear(30, 20, device=dev), nn.ReLU(), nn.Linear(20, 5, device=dev))
    x = np.random.default_rng(9).standard_normal((7, 30)).astype(np.float32)
    float_out = model(t(x)).numpy()
    w0 = model[0].weight.detach().numpy()
    size_before = Q.model_size(model)
    qm = Q.quantize_dynamic(model, {nn.Linear}, ember.int8)
    assert qm is model and isinstance(model[0], Q.DynamicQuantizedLinear)
    size_after = Q.model_size(model)
    assert size_before["weights_bytes"] == (30 * 20 + 20 + 20 * 5 + 5) * 4
    assert size_after["weights_bytes"] == 30 * 20 + 20 * 5 + (20 + 5) * 4 * 2
    # layer 0 by hand: per-channel weight, per-row activation scales
    wq, sw, _ = _ref_int8(w0, "symmetric", (1,))
    xs = np.abs(x).max(1, keepdims=True) / np.float32(127)
    xq = np.clip(np.round(x / xs), -127, 127)
    ref = (xq @ wq.T.astype(np.float32)) * xs * sw.reshape(1, -1) + model[0].bias.detach().numpy()
    np.testing.assert_allclose(model[0](t(x)).numpy(), ref, rtol=1e-5, atol=1e-5)
    out = model(t(x)).numpy()
    assert np.abs(out - float_out).max() < 0.05
    with pytest.raises(DTypeError):
        Q.quantize_dynamic(nn.Sequential(nn.Linear(2, 2)), dtype=ember.float16)
    with pytest.raises(ValueRangeError, match="qconfig_spec"):
        Q.quantize_dynamic(nn.Sequential(nn.Linear(2, 2)), {nn.Embedding})
    with pytest.raises(ValueRangeError, match="qconfig_spec"):
        Q.quantize_dynamic(nn.Sequential(nn.Linear(2, 2)), set())
    with pytest.raises(DTypeError):
        Q.quantize_dynamic(nn.Linear(2, 2))
    copy = Q.quantize_dynamic(nn.Sequential(nn.Linear(2, 2)), inplace=False)
    assert isinstance(copy[0], Q.DynamicQuantizedLinear)


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect"])
@pytest.mark.parametrize("groups", [1, 2])
def test_dynamic_conv2d_matches_torch_fake_quant(padding_mode: str, groups: int) -> None:
    """Weights per output channel and activations per sample, symmetric int8 with round half to even: the same as
    torch's fake quantization with those scales followed by a float convolution."""
    dev = Device.parse(TOY)
    ember.manual_seed(3)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=groups, padding_mode=padding_mode, device=dev)
    x = np.random.default_rng(4).standard_normal((3, 4, 9, 8)).astype(np.float32)
    x[1] *= 10  # a sample with another range gets its own scale
    float_out = conv(t(x)).numpy()
    model = Q.quantize_dynamic(nn.Sequential(conv), {nn.Conv2d})
    q = model[0]
    assert isinstance(q, Q.DynamicQuantizedConv2d) and q.weight.dtype is ember.int8
    out = q(t(x)).numpy()

    w = torch.from_numpy(conv.weight.detach().numpy())
    sw = w.abs().amax((1, 2, 3)) / 127
    wq = torch.fake_quantize_per_channel_affine(w, sw, torch.zeros(6, dtype=torch.int32), 0, -127, 127)
    xt = torch.from_numpy(x)
    sx = xt.abs().amax((1, 2, 3)) / 127
    xq = torch.fake_quantize_per_channel_affine(xt, sx, torch.zeros(3, dtype=torch.int32), 0, -127, 127)
    ref_conv = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=groups, padding_mode=padding_mode)
    with torch.no_grad():
        ref_conv.weight.copy_(wq)
        ref_conv.bias.copy_(torch.from_numpy(conv.bias.detach().numpy()))
        ref = ref_conv(xq).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # int8 stays close to the float layer: a relative error of a few 1/127 steps
    assert np.abs(out - float_out).max() < 0.03 * np.abs(float_out).max()
    # unbatched input: the same as a batch of one
    np.testing.assert_allclose(q(t(x[1])).numpy(), out[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(q(t(np.zeros_like(x))).numpy(), np.broadcast_to(
        conv.bias.detach().numpy().reshape(1, -1, 1, 1), out.shape), atol=0)


def test_dynamic_conv2d_bad_input_and_sizes() -> None:
    dev = Device.parse(TOY)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, device=dev), nn.Flatten(), nn.Linear(4 * 4 * 4, 3, device=dev))
    before = Q.model_size(model)["weights_bytes"]
    Q.quantize_dynamic(model, {nn.Linear, nn.Conv2d})
    assert isinstance(model[0], Q.DynamicQuantizedConv2d) and isinstance(model[2], Q.DynamicQuantizedLinear)
    assert before == (2 * 4 * 9 + 4 + 64 * 3 + 3) * 4
    assert Q.model_size(model)["weights_bytes"] == 2 * 4 * 9 + 64 * 3 + (4 + 3) * 4 * 2
    assert "int8" in repr(model[0])
    with pytest.raises(ShapeError, match=r"DynamicQuantizedConv2d: expected input of shape \(N, 2, H, W\)"):
        model[0](t(np.zeros((1, 3, 6, 6), np.float32)))
    with pytest.raises(DTypeError, match="floating-point input, got int64"):
        model[0](ember.zeros((1, 2, 6, 6), dtype=ember.int64, device=dev))
    with pytest.raises(DTypeError, match="expected an nn.Conv2d, got Linear"):
        Q.DynamicQuantizedConv2d.from_conv(nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(DTypeError, match="model is itself an nn.Conv2d"):
        Q.quantize_dynamic(nn.Conv2d(1, 1, 1), {nn.Conv2d})
    # the default (torch's) quantizes Linear layers only
    plain = Q.quantize_dynamic(nn.Sequential(nn.Conv2d(1, 1, 1), nn.Linear(2, 2)))
    assert type(plain[0]) is nn.Conv2d and isinstance(plain[1], Q.DynamicQuantizedLinear)


def test_quantize_dynamic_leaves_attention_projections_float() -> None:
    """torch types MultiheadAttention.out_proj NonDynamicallyQuantizableLinear so quantize_dynamic passes it by: the
    attention reads its weight directly. ember does the same, and an encoder layer still runs after quantization."""
    dev = Device.parse(TOY)
    ember.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True, device=dev)
    x = ember.randn(2, 5, 16, device=dev)
    before = layer(x).numpy()
    model = Q.quantize_dynamic(nn.Sequential(layer))
    assert type(model[0].self_attn.out_proj) is nn.Linear
    assert isinstance(model[0].linear1, Q.DynamicQuantizedLinear)
    assert np.abs(model(x).numpy() - before).max() < 0.05


# -- records -----------------------------------------------------------------------------------------------------------
def test_save_load_quantized_values_and_models(tmp_path: Any) -> None:
    dev = Device.parse(TOY)
    rng = np.random.default_rng(10)
    values = {"a": Q.quantize(t(rng.standard_normal((8, 64)).astype(np.float32)), "nf4", double_quant=True),
              "b": Q.quantize(t(rng.standard_normal((5, 3)).astype(np.float32)), "int8", scheme="asymmetric",
                              granularity="per_channel", axis=1),
              "c": t(np.arange(3, dtype=np.float32))}
    path = tmp_path / "q.safetensors"
    Q.save(values, path)
    meta = json.loads(ember.records.read_metadata(path)["quantization"])
    assert meta["a"]["format"] == "nf4" and meta["a"]["double_quant"] is True and meta["b"]["axis"] == 1
    back = Q.load(path, device=dev)
    assert isinstance(back["a"], Q.QuantizedTensor) and back["a"].tag() == values["a"].tag()
    for k in ("a", "b"):
        for part, tt in values[k].tensors().items():
            assert np.array_equal(back[k].tensors()[part].numpy(), tt.numpy())
        assert np.array_equal(back[k].dequantize().numpy(), values[k].dequantize().numpy())
    assert back["c"].tolist() == [0.0, 1.0, 2.0]

    # a QLoRA-style model: quantized layers round-trip; a float model gets the dequantized weights, with a warning
    def build() -> nn.Sequential:
        return nn.Sequential(nn.Linear(64, 32, device=dev), nn.ReLU(), nn.Linear(32, 4, device=dev))

    src = build()
    setattr(src, "0", Q.Linear4bit.from_linear(src[0], "nf4", double_quant=True))
    Q.save(src, path)
    dst = build()
    setattr(dst, "0", Q.Linear4bit.from_linear(dst[0], "nf4", double_quant=True))
    Q.load(path, into=dst)
    x = t(rng.standard_normal((2, 64)).astype(np.float32))
    assert np.array_equal(dst(x).numpy(), src(x).numpy())
    plain = build()
    with pytest.warns(Q.DequantizedOnLoadWarning, match=r"\['0.weight'\]"):
        Q.load(path, into=plain)
    np.testing.assert_array_equal(plain[0].weight.detach().numpy(), src[0].quantized_weight().dequantize().numpy())
    np.testing.assert_allclose(plain(x).numpy(), src(x).numpy(), rtol=1e-5, atol=1e-6)
    other = build()
    setattr(other, "0", Q.Linear4bit.from_linear(other[0], "fp4"))
    with pytest.raises(ShapeError, match="stored as"):
        Q.load(path, into=other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Q.load(path)  # reading alone never warns
    with pytest.raises(DTypeError):
        Q.save({"x": 3}, path)  # type: ignore[dict-item]
