"""ember-lora's OpenCL kernels for core's quantization ops: quantize/dequantize bit-exact with the flex path (and a
numpy reference of bitsandbytes' published algorithm), the 4-bit matmul within float tolerance of
dequantize-then-matmul, QLoRA on ``opencl+autodiff``, typed errors, threads; skipped where there is no OpenCL
device."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

import ember
from ember import Device
from ember import quantization as Q
from ember.errors import DeviceError, DTypeError, PluginError, ShapeError, ValueRangeError
from ember.quantization import ops as qops
from ember_lora import LoraConfig, apply_qlora
from ember_lora import quant_opencl as K

OPS = ("quantize_4bit", "dequantize_4bit", "matmul_4bit", "quantize_int8", "dequantize_int8")


@pytest.fixture(scope="module")
def cl() -> Device:
    try:
        dev = Device.parse("opencl")
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"no OpenCL device here: {exc}")
    return dev


def test_kernels_are_registered_for_opencl() -> None:
    ember.zeros(1)  # loads the plugins
    for name in OPS:
        assert ember.extension.get(f"quant.{name}").kernels["opencl"] is getattr(K, name), name


def _reference_4bit(x: np.ndarray, blocksize: int, quant_type: str) -> tuple[np.ndarray, np.ndarray]:
    """bitsandbytes' algorithm in numpy: block absmax, float32 reciprocal, code = thresholds exceeded (ties low)."""
    blocks = x.astype(np.float32).reshape(-1, blocksize)
    absmax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):  # inf * 0 is NaN, as on the device
        recip = np.where(absmax > 0, np.float32(1) / absmax, np.float32(0)).astype(np.float32)
        scaled = blocks * recip[:, None]
    thr = np.asarray(qops.THRESHOLDS[quant_type], np.float32)
    if quant_type == "nf4":
        codes = (scaled[..., None] > thr).sum(-1)
    else:
        order = np.asarray(qops.FP4_ORDER)
        codes = order[(np.abs(scaled)[..., None] > thr).sum(-1)] + 8 * (scaled < 0)
    pairs = codes.reshape(-1, 2).astype(np.uint8)
    return ((pairs[:, 0] << 4) | pairs[:, 1]).astype(np.uint8), absmax


def _awkward(rng: np.random.Generator, quant_type: str, blocksize: int) -> np.ndarray:
    """Blocks of normal values, one all zero, one whose absmax is 1 holding every threshold exactly (ties), signed
    zeros, infinities and a NaN."""
    n_blocks = max(4, 4096 // blocksize)
    x = rng.normal(size=n_blocks * blocksize).astype(np.float32)
    x[:blocksize] = 0.0
    ties = np.asarray(qops.THRESHOLDS[quant_type], np.float32)
    row = x[blocksize:2 * blocksize]
    row[:] = 0.0
    row[0] = 1.0
    row[1:1 + len(ties)] = ties
    row[1 + len(ties):1 + 2 * len(ties)] = -ties
    row[-1] = -0.0
    x[2 * blocksize + 3] = np.inf
    x[3 * blocksize + 5] = np.nan
    return x


@pytest.mark.parametrize("blocksize", [32, 64, 4096])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_quantize_and_dequantize_4bit_bit_exact(cl: Device, quant_type: str, blocksize: int) -> None:
    x = _awkward(np.random.default_rng(blocksize), quant_type, blocksize)
    packed, absmax = qops.quantize_4bit(ember.tensor(x, device=cl), blocksize=blocksize, quant_type=quant_type)
    with np.errstate(invalid="ignore"):  # ember-flex's numpy kernel scales inf by 0 (NaN, code 0) as well
        flex_packed, flex_absmax = qops.quantize_4bit(ember.tensor(x), blocksize=blocksize, quant_type=quant_type)
    ref_packed, ref_absmax = _reference_4bit(x, blocksize, quant_type)
    # NaN's block keeps a NaN absmax and codes 0 for the NaN (numpy's max, bitsandbytes' decision tree)
    np.testing.assert_array_equal(packed.numpy(), flex_packed.numpy())
    np.testing.assert_array_equal(absmax.numpy(), flex_absmax.numpy())
    finite = np.isfinite(ref_absmax)
    np.testing.assert_array_equal(absmax.numpy()[finite], ref_absmax[finite])
    ok = np.repeat(finite, blocksize // 2)
    np.testing.assert_array_equal(packed.numpy()[ok], ref_packed[ok])
    for dtype in (ember.float32, ember.float64, ember.bfloat16):
        got = qops.dequantize_4bit(packed, absmax, blocksize=blocksize, quant_type=quant_type, dtype=dtype)
        want = qops.dequantize_4bit(flex_packed, flex_absmax, blocksize=blocksize, quant_type=quant_type,
                                    dtype=dtype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.to(ember.float64).numpy(), want.to(ember.float64).numpy())


@pytest.mark.parametrize("double_quant", [False, True], ids=["absmax", "double-quant"])
@pytest.mark.parametrize("fmt", ["nf4", "fp4"])
def test_quantized_tensor_round_trip_equals_flex(cl: Device, fmt: str, double_quant: bool) -> None:
    w = np.random.default_rng(0).normal(size=(37, 50)).astype(np.float32)  # padded: not whole blocks
    on_cl = Q.quantize(ember.tensor(w, device=cl), fmt, blocksize=64, double_quant=double_quant)
    on_flex = Q.quantize(ember.tensor(w), fmt, blocksize=64, double_quant=double_quant)
    for name, t in on_flex.tensors().items():
        np.testing.assert_array_equal(on_cl.tensors()[name].numpy(), t.numpy(), err_msg=name)
    np.testing.assert_array_equal(on_cl.dequantize().numpy(), on_flex.dequantize().numpy())


INT8 = [("symmetric", "per_tensor", 0), ("symmetric", "per_channel", 0), ("symmetric", "per_channel", 1),
        ("symmetric", "per_channel", 2), ("symmetric", "per_block", 0), ("asymmetric", "per_tensor", 0),
        ("asymmetric", "per_channel", 1)]


@pytest.mark.parametrize("scheme,granularity,axis", INT8, ids=[f"{s}-{g}-{a}" for s, g, a in INT8])
def test_int8_bit_exact(cl: Device, scheme: str, granularity: str, axis: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(5, 6, 70)) * rng.uniform(0.1, 3, size=(5, 6, 1))).astype(np.float32)
    x[0, 0, :] = 0.0
    x[1, 1, 1] = -0.0
    on_cl = Q.quantize(ember.tensor(x, device=cl), "int8", scheme=scheme, granularity=granularity, axis=axis)
    on_flex = Q.quantize(ember.tensor(x), "int8", scheme=scheme, granularity=granularity, axis=axis)
    for name, t in on_flex.tensors().items():
        np.testing.assert_array_equal(on_cl.tensors()[name].numpy(), t.numpy(), err_msg=name)
    for dtype in (ember.float32, ember.float64, ember.bfloat16):
        np.testing.assert_array_equal(on_cl.dequantize(dtype).to(ember.float64).numpy(),
                                      on_flex.dequantize(dtype).to(ember.float64).numpy())


def test_int8_rounds_half_to_even(cl: Device) -> None:
    # absmax 127 gives scale 1: x / scale is x itself, and the .5 values must round to even as torch.round does
    x = np.array([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5], np.float32)
    q = qops.quantize_int8(ember.tensor(x.reshape(1, 1, -1), device=cl), ember.tensor([1.0], device=cl), None,
                           qmin=-127, qmax=127)
    np.testing.assert_array_equal(q.numpy().reshape(-1), [127, 0, 2, 2, 0, -2, -2, 126])


MATMUL = [((7, 200), 96, 200, False), ((2, 3, 64), 33, 64, False), ((5, 40), 40, 24, True), ((1, 17), 9, 17, False),
          ((3, 0, 64), 16, 64, False), ((4, 96), 96, 200, True)]


@pytest.mark.parametrize("chunk", [1 << 20, 200], ids=["one-chunk", "chunks"])
@pytest.mark.parametrize("xshape,out_f,in_f,transpose", MATMUL,
                         ids=[f"{'x'.join(map(str, s))}-{o}x{i}{'-T' if t else ''}" for s, o, i, t in MATMUL])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_matmul_4bit_matches_dequantize_then_matmul(cl: Device, quant_type: str, xshape: tuple[int, ...],
                                                    out_f: int, in_f: int, transpose: bool, chunk: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # a small chunk: the weight is dequantized a few rows at a time (rows spanning whole blocks of 32)
    monkeypatch.setattr(K, "CHUNK_ELEMENTS", chunk)
    rng = np.random.default_rng(2)
    w = rng.normal(size=(out_f, in_f)).astype(np.float32)
    q = Q.quantize(ember.tensor(w, device=cl), quant_type, blocksize=32)
    deq = q.dequantize().numpy().astype(np.float64)
    x = rng.normal(size=xshape).astype(np.float32)
    bias = None if transpose else rng.normal(size=(out_f,)).astype(np.float32)
    out = qops.matmul_4bit(ember.tensor(x, device=cl), q.data, q.absmax(),
                           None if bias is None else ember.tensor(bias, device=cl), out_features=out_f,
                           in_features=in_f, blocksize=32, quant_type=quant_type, transpose=transpose)
    want = x.astype(np.float64) @ (deq if transpose else deq.T) + (0 if bias is None else bias)
    assert out.shape == want.shape and out.dtype == ember.float32
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-4)
    # the composition on the same device (dequantize kernel, then the backend's matmul)
    comp = qops.matmul_4bit.composition(ember.tensor(x, device=cl), q.data, q.absmax(),
                                        None if bias is None else ember.tensor(bias, device=cl), out_features=out_f,
                                        in_features=in_f, blocksize=32, quant_type=quant_type, transpose=transpose)
    np.testing.assert_allclose(out.numpy(), comp.numpy(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [ember.float64, ember.bfloat16], ids=["float64", "bfloat16"])
def test_matmul_4bit_other_dtypes(cl: Device, dtype: ember.DType) -> None:
    if not cl.supports_dtype(dtype):
        pytest.skip("no cl_khr_fp64 on this device")
    rng = np.random.default_rng(3)
    w = rng.normal(size=(20, 64)).astype(np.float32)
    q = Q.quantize(ember.tensor(w, device=cl), "nf4")
    x = ember.tensor(rng.normal(size=(4, 64)), dtype=dtype, device=cl)
    out = qops.matmul_4bit(x, q.data, q.absmax(), None, out_features=20, in_features=64, blocksize=64,
                           quant_type="nf4")
    assert out.dtype == dtype
    want = x.to(ember.float64).numpy() @ q.dequantize().numpy().astype(np.float64).T
    tol = 1e-10 if dtype is ember.float64 else 5e-2
    np.testing.assert_allclose(out.to(ember.float64).numpy(), want, rtol=tol, atol=tol * 10)


def test_qlora_trains_on_opencl_like_flex() -> None:
    try:
        dev = Device.parse("opencl+autodiff")
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"no OpenCL device here: {exc}")
    from ember import nn

    grads = {}
    outs = {}
    ember.manual_seed(0)
    base = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 5)).to("flex+autodiff")
    apply_qlora(base, LoraConfig(r=4, target_modules=["0", "2"], init_lora_weights=False))
    for name in ("flex+autodiff", "opencl+autodiff"):
        model = copy.deepcopy(base).to(name)  # the same 4-bit weights and adapters on both devices
        assert model[0].base_layer._buffers["weight"].device == Device.parse(name)
        x = ember.tensor(np.random.default_rng(4).normal(size=(6, 64)), dtype=ember.float32, device=name)
        out = model(x)
        out.pow(2).sum().backward()
        outs[name] = out.detach().numpy()
        grads[name] = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
    np.testing.assert_allclose(outs["opencl+autodiff"], outs["flex+autodiff"], rtol=1e-4, atol=1e-4)
    assert grads["opencl+autodiff"].keys() == grads["flex+autodiff"].keys() and grads["flex+autodiff"]
    for n, g in grads["flex+autodiff"].items():
        np.testing.assert_allclose(grads["opencl+autodiff"][n], g, rtol=1e-3, atol=1e-3, err_msg=n)


def test_bad_input_is_refused_before_the_kernel(cl: Device) -> None:
    q = Q.quantize(ember.randn(8, 64, device=cl), "nf4")
    kw = {"out_features": 8, "in_features": 64, "blocksize": 64, "quant_type": "nf4"}
    with pytest.raises(ShapeError, match=r"matmul_4bit: expected an input \(\.\.\., 64\)"):
        qops.matmul_4bit(ember.randn(2, 63, device=cl), q.data, q.absmax(), None, **kw)
    with pytest.raises(DTypeError, match="matmul_4bit: expected a floating-point input"):
        qops.matmul_4bit(ember.ones(2, 64, dtype=ember.int64, device=cl), q.data, q.absmax(), None, **kw)
    with pytest.raises(ShapeError, match="quantize_4bit: expected a flat tensor of whole blocks of 64"):
        qops.quantize_4bit(ember.randn(65, device=cl), blocksize=64, quant_type="nf4")
    with pytest.raises(ShapeError, match="quantize_int8: expected a float32 scale of shape"):
        qops.quantize_int8(ember.randn(1, 3, 4, device=cl), ember.ones(2, device=cl), None, qmin=-127, qmax=127)
    with pytest.raises(DTypeError, match="dequantize_int8: expected int8 codes"):
        qops.dequantize_int8(ember.ones(1, 1, 4, device=cl), ember.ones(1, device=cl), None)


def test_threads_share_the_kernels(cl: Device) -> None:
    rng = np.random.default_rng(5)
    w = rng.normal(size=(48, 96)).astype(np.float32)
    q = Q.quantize(ember.tensor(w, device=cl), "nf4", blocksize=32)
    xs = [ember.tensor(rng.normal(size=(9, 96)).astype(np.float32), device=cl) for _ in range(6)]
    kw = {"out_features": 48, "in_features": 96, "blocksize": 32, "quant_type": "nf4"}
    want = [qops.matmul_4bit(x, q.data, q.absmax(), None, **kw).numpy() for x in xs]
    want_q = Q.quantize(ember.tensor(w), "nf4", blocksize=32).data.numpy()
    got: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            out = qops.matmul_4bit(xs[i], q.data, q.absmax(), None, **kw).numpy()
            packed = Q.quantize(ember.tensor(w, device=cl), "nf4", blocksize=32).data.numpy()
            got[i] = (out, packed)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors
    for i, w_out in enumerate(want):
        np.testing.assert_array_equal(got[i][0], w_out)
        np.testing.assert_array_equal(got[i][1], want_q)


def test_int8_ops_refuse_bad_input_on_every_device() -> None:
    x = ember.randn(2, 3, 4)
    with pytest.raises(ShapeError, match="quantize_int8: expected a 3-d"):
        qops.quantize_int8(ember.randn(3, 4), ember.ones(3), None, qmin=-127, qmax=127)
    with pytest.raises(DTypeError, match="quantize_int8: expected a float32 tensor, got float64"):
        qops.quantize_int8(x.to(ember.float64), ember.ones(3), None, qmin=-127, qmax=127)
    with pytest.raises(ShapeError, match="quantize_int8: expected a float32 zero_point of shape"):
        qops.quantize_int8(x, ember.ones(3), ember.zeros(2), qmin=-128, qmax=127)
    with pytest.raises(ValueRangeError, match="quantize_int8: expected -128 <= qmin < qmax <= 127"):
        qops.quantize_int8(x, ember.ones(3), None, qmin=-200, qmax=127)
    q = qops.quantize_int8(x, ember.ones(3), None, qmin=-127, qmax=127)
    with pytest.raises(ShapeError, match="dequantize_int8: expected a int8 zero_point"):
        qops.dequantize_int8(q, ember.ones(3), ember.zeros(3))
    with pytest.raises(DTypeError, match="dequantize_int8: dtype must be a floating-point"):
        qops.dequantize_int8(q, ember.ones(3), None, dtype=ember.int32)
