"""The flex kernels of core's 4-bit quantization ops (quant.quantize_4bit, quant.dequantize_4bit, quant.matmul_4bit)
against the ops' compositions (bit for bit where the arithmetic is the same) and against torch (the matmul and its
backward through Linear4bit); the matmul's chunking is exercised with tiny chunks, on shapes whose rows do not
span whole blocks. Every test checks the kernels really ran."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device, nn
from ember import quantization as Q
from ember.quantization import ops

torch = pytest.importorskip("torch")

DEVICES = ["flex+autodiff", "flex+fusion(False)+autodiff"]


@pytest.fixture
def calls() -> Iterator[dict[str, int]]:
    """Count the kernels' calls (the originals are restored afterwards)."""
    ember.zeros(1)  # plugins load lazily: the flex kernels are registered once flex is loaded
    ops_ = {"quantize": ops.quantize_4bit, "dequantize": ops.dequantize_4bit, "matmul": ops.matmul_4bit}
    originals = {k: op.kernels["flex"] for k, op in ops_.items()}
    counts = dict.fromkeys(ops_, 0)

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for k, op in ops_.items():
        op.kernel("flex")(counting(k, originals[k]))
    try:
        yield counts
    finally:
        for k, op in ops_.items():
            op.kernel("flex")(originals[k])


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import ember_flex.quant_kernels as K

    monkeypatch.setattr(K, "CHUNK_ELEMENTS", 200)  # a few rows per chunk


def _flex(a: np.ndarray, **kw: Any) -> ember.Tensor:
    return ember.tensor(a, device=Device.parse("flex"), **kw)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [32, 64, 256])
def test_quantize_dequantize_match_composition(calls: dict[str, int], quant_type: str, blocksize: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(blocksize * 7).astype(np.float32) * 5
    x[:blocksize] = 0.0  # an all-zero block
    x[blocksize] = np.nan  # NaN takes code 0, as bitsandbytes' tree
    thr = np.float32(ops.THRESHOLDS[quant_type])
    x[2 * blocksize:2 * blocksize + 1] = 1.0
    x[2 * blocksize + 1:2 * blocksize + 1 + thr.size] = thr  # ties go to the lower code
    xt = _flex(x)
    packed, absmax = ops.quantize_4bit(xt, blocksize=blocksize, quant_type=quant_type)
    p2, a2 = ops.quantize_4bit.composition(xt, blocksize=blocksize, quant_type=quant_type)
    assert calls["quantize"] == 1
    np.testing.assert_array_equal(packed.numpy()[blocksize:], p2.numpy()[blocksize:])  # block 1 has the NaN
    assert packed.numpy()[blocksize // 2] >> 4 == 0
    np.testing.assert_array_equal(absmax.numpy()[2:], a2.numpy()[2:])
    clean = np.nan_to_num(x)
    ok = _flex(clean)
    pk, ab = ops.quantize_4bit(ok, blocksize=blocksize, quant_type=quant_type)
    pc, ac = ops.quantize_4bit.composition(ok, blocksize=blocksize, quant_type=quant_type)
    np.testing.assert_array_equal(pk.numpy(), pc.numpy())
    np.testing.assert_array_equal(ab.numpy(), ac.numpy())
    for dtype in (ember.float32, ember.float64, ember.bfloat16):
        d = ops.dequantize_4bit(pk, ab, blocksize=blocksize, quant_type=quant_type, dtype=dtype)
        dc = ops.dequantize_4bit.composition(pk, ab, blocksize=blocksize, quant_type=quant_type, dtype=dtype)
        assert d.dtype is dtype
        np.testing.assert_array_equal(d.to(ember.float32).numpy(), dc.to(ember.float32).numpy())
    assert calls["dequantize"] == 3


@pytest.mark.parametrize("shape", [(48, 40), (37, 24), (10, 64)], ids=["48x40", "37x24", "10x64"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_matmul_chunks_vs_composition(calls: dict[str, int], small_chunks: None, shape: tuple[int, int],
                                      dtype: str) -> None:
    rng = np.random.default_rng(1)
    out_f, in_f = shape
    q = Q.quantize(_flex(rng.standard_normal(shape).astype(np.float32)), "nf4", blocksize=32)
    d = getattr(ember, dtype)
    x = _flex(rng.standard_normal((3, 2, in_f))).to(d)
    b = _flex(rng.standard_normal(out_f)).to(d)
    kw = {"out_features": out_f, "in_features": in_f, "blocksize": 32, "quant_type": "nf4"}
    y = ops.matmul_4bit(x, q.data, q.scale, b, **kw)
    yc = ops.matmul_4bit.composition(x, q.data, q.scale, b, **kw)
    assert calls["matmul"] == 1 and y.dtype is d and tuple(y.shape) == (3, 2, out_f)
    tol = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 2e-2}[dtype]
    np.testing.assert_allclose(y.to(ember.float64).numpy(), yc.to(ember.float64).numpy(), rtol=tol, atol=tol * 10)
    g = _flex(rng.standard_normal((3, 2, out_f))).to(d)
    dx = ops.matmul_4bit(g, q.data, q.scale, None, **kw, transpose=True)
    dxc = ops.matmul_4bit.composition(g, q.data, q.scale, None, **kw, transpose=True)
    assert tuple(dx.shape) == (3, 2, in_f)
    np.testing.assert_allclose(dx.to(ember.float64).numpy(), dxc.to(ember.float64).numpy(), rtol=tol,
                               atol=tol * 10)


def test_chunks_never_hold_the_whole_weight(small_chunks: None) -> None:
    import ember_flex.quant_kernels as K

    assert K._rows_per_chunk(1000, 40, 64) == 8  # the fewest rows spanning whole blocks (8 * 40 = 5 * 64)
    assert K._rows_per_chunk(1000, 10, 32) == 16  # 16 * 10 = 5 * 32 <= 200 < 32 * 10
    assert K._rows_per_chunk(3, 40, 64) == 3


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_linear4bit_vs_torch(calls: dict[str, int], small_chunks: None, dev: str, quant_type: str) -> None:
    device = Device.parse(dev)
    rng = np.random.default_rng(2)
    lin = nn.Linear(72, 30, device=device)
    layer = Q.Linear4bit.from_linear(lin, quant_type, blocksize=64, double_quant=True)
    layer.bias.requires_grad_(True)
    w = layer.quantized_weight().dequantize().numpy()
    x = rng.standard_normal((4, 72)).astype(np.float32)
    ex = ember.tensor(x, device=device, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    tb = torch.tensor(lin.bias.detach().numpy(), requires_grad=True)
    y = layer(ex)
    ty = torch.nn.functional.linear(tx, torch.tensor(w), tb)
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.bias.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert calls["matmul"] == 2  # forward and the vjp's transposed product
