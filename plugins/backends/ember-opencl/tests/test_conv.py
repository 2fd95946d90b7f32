"""Tests of ember_opencl.conv: convolution, transposed convolution and the conv gradient kernels against torch.

The kit (``--ember-device=opencl -k conv``) covers the public API; these call the module's functions on device
handles directly, so they also reach what the public API cannot express (negative and asymmetric (lo, hi)
padding, the gradient kernels without the autodiff stack) and the kernel-specific paths: 1x1 convolutions, batch
chunking, strided views, float16/float64, sizes beyond one work-group.
"""

from __future__ import annotations

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")
torch = pytest.importorskip("torch")

import ember  # noqa: E402
from ember.errors import ShapeError  # noqa: E402
from ember.nn import functional as F  # noqa: E402
from ember_opencl import array as arr  # noqa: E402
from ember_opencl import conv  # noqa: E402
from ember_opencl.runtime import device_count  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

TF = torch.nn.functional
TOL = {np.float32: dict(rtol=1e-4, atol=1e-4), np.float64: dict(rtol=1e-9, atol=1e-10),
       np.float16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture(scope="module")
def be():
    return ember.Device.opencl(0).stack


def up(be, a: np.ndarray, layout: str = "contiguous") -> arr.CLArray:
    """A device handle holding a; "strided" gives a non-contiguous view (batch/channel swap, step 2 in the last dim)."""
    if layout == "contiguous":
        return be.from_numpy(np.ascontiguousarray(a))
    # store (C, N, ..., 2 * last) holding a at even positions of the last dim, then view it back as (N, C, ...)
    t = np.swapaxes(a, 0, 1)
    host = np.zeros(t.shape[:-1] + (2 * t.shape[-1],), a.dtype)
    host[..., ::2] = t
    h = arr.basic_index(be.from_numpy(host), (Ellipsis, slice(None, None, 2)))
    view = arr.permute(h, (1, 0) + tuple(range(2, a.ndim)))
    assert not view.is_contiguous
    return view


def down(be, h: arr.CLArray) -> np.ndarray:
    return be.to_numpy(h)


def rand(shape, dtype=np.float32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def tconv(nd: int, x, w, b, stride, pads, dilation, groups):
    """torch's convolution with (lo, hi) padding pairs (negative crops) through F.pad."""
    flat = []
    for lo, hi in reversed(pads):
        flat += [lo, hi]
    xp = TF.pad(x, flat) if any(flat) else x
    return getattr(TF, f"conv{nd}d")(xp, w, b, stride=stride, dilation=dilation, groups=groups)


def ref_dtype(dtype):
    """torch reference computes float16 cases in float32 (on the float16 values)."""
    return torch.float64 if dtype == np.float64 else torch.float32


# nd, N, C_in, C_out, spatial, kernel, stride, pads, dilation, groups
CASES = [
    (1, 2, 3, 4, (17,), (3,), (1,), ((0, 0),), (1,), 1),
    (1, 3, 4, 6, (20,), (5,), (2,), ((2, 1),), (2,), 2),
    (1, 2, 6, 6, (13,), (3,), (1,), ((-2, 1),), (1,), 6),  # depthwise, cropped start
    (2, 2, 3, 5, (9, 11), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    (2, 1, 4, 4, (8, 7), (3, 2), (2, 1), ((1, 0), (0, 2)), (1, 2), 4),
    (2, 3, 4, 8, (10, 9), (3, 3), (2, 3), ((-1, 2), (2, -1)), (2, 1), 2),
    (2, 2, 8, 8, (7, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 8),  # depthwise 3x3
    (2, 3, 5, 7, (6, 5), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),  # pointwise: x is its own column matrix
    (2, 2, 4, 6, (6, 5), (1, 1), (2, 1), ((0, 1), (0, 0)), (1, 1), 2),  # 1x1 but strided/padded: im2col path
    (3, 1, 2, 3, (5, 6, 4), (3, 2, 3), (1, 2, 1), ((1, 1), (1, 0), (0, 1)), (1, 1, 1), 1),
    (3, 2, 4, 4, (4, 5, 6), (2, 3, 2), (1, 1, 2), ((0, 0), (-1, 1), (1, 1)), (2, 1, 1), 2),
]
IDS = [f"{c[0]}d-{i}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_forward(be, case, dtype, bias):
    nd, n, cin, cout, sp, k, st, pads, dl, g = case
    x, w = rand((n, cin) + sp, dtype, 1), rand((cout, cin // g) + k, dtype, 2)
    b = rand((cout,), dtype, 3) if bias else None
    rd = ref_dtype(dtype)
    ref = tconv(nd, torch.tensor(x, dtype=rd), torch.tensor(w, dtype=rd),
                None if b is None else torch.tensor(b, dtype=rd), st, pads, dl, g).numpy()
    layout = "strided" if dtype == np.float32 else "contiguous"
    y = conv.conv(up(be, x, layout), up(be, w), None if b is None else up(be, b), st, pads, dl, g)
    assert y.shape == ref.shape and y.dtype.numpy == dtype and y.is_contiguous
    np.testing.assert_allclose(down(be, y).astype(np.float64), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_gradients(be, case, dtype):
    nd, n, cin, cout, sp, k, st, pads, dl, g = case
    x, w = rand((n, cin) + sp, dtype, 4), rand((cout, cin // g) + k, dtype, 5)
    rd = ref_dtype(dtype)
    tx = torch.tensor(x, dtype=rd, requires_grad=True)
    tw = torch.tensor(w, dtype=rd, requires_grad=True)
    ty = tconv(nd, tx, tw, None, st, pads, dl, g)
    gy = rand(tuple(ty.shape), dtype, 6)
    ty.backward(torch.tensor(gy, dtype=rd))
    layout = "strided" if dtype == np.float32 else "contiguous"
    dx = conv.conv_input_grad(up(be, gy, layout), up(be, w), x.shape, st, pads, dl, g)
    dw = conv.conv_weight_grad(up(be, x, layout), up(be, gy, layout), w.shape, st, pads, dl, g)
    assert dx.shape == x.shape and dw.shape == w.shape
    assert dx.dtype.numpy == dtype and dw.dtype.numpy == dtype
    # a weight gradient sums N * L products: allow for that in float16
    tol = dict(rtol=5e-2, atol=5e-2 * max(1.0, float(np.abs(tw.grad.numpy()).max()) / 10)) if dtype == np.float16 \
        else TOL[dtype]
    np.testing.assert_allclose(down(be, dx).astype(np.float64), tx.grad.numpy(), **TOL[dtype])
    np.testing.assert_allclose(down(be, dw).astype(np.float64), tw.grad.numpy(), **tol)


ALGOS = [{"kind": "gemm"}, {"kind": "direct", "cot": 1}, {"kind": "direct", "cot": 4}, {"kind": "direct", "cot": 16}]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("algo", ALGOS, ids=["gemm", "direct1", "direct4", "direct16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_algorithms(be, case, algo, dtype):
    """Every algorithm the tuner may pick gives torch's result (direct tiles that do not divide C_out/groups
    included), whatever the tuner picked on this device."""
    nd, n, cin, cout, sp, k, st, pads, dl, g = case
    x, w, b = rand((n, cin) + sp, dtype, 34), rand((cout, cin // g) + k, dtype, 35), rand((cout,), dtype, 36)
    ref = tconv(nd, torch.tensor(x, dtype=torch.float32), torch.tensor(w, dtype=torch.float32),
                torch.tensor(b, dtype=torch.float32), st, pads, dl, g).numpy()
    out_size = tuple(ref.shape[2:])
    y = conv._conv_with(algo, up(be, x, "strided"), up(be, w), up(be, b), st, pads, dl, g, out_size)
    assert y.shape == ref.shape and y.is_contiguous
    np.testing.assert_allclose(down(be, y).astype(np.float64), ref, **TOL[dtype])


def test_algorithm_choice_is_tuned(be, monkeypatch):
    """A depthwise conv times the direct kernels against the GEMM through the device's TuneStore (every candidate's
    run() works and returns a time) and uses the winner; a long reduction is not tuned at all."""
    calls = []

    class Store:
        def tune(self, op, key, cands, run):
            if op != conv.TUNE_OP:  # the GEMM's own tuning
                return cands[-1]
            times = [run(c) for c in cands]
            calls.append((op, key, cands, times))
            return cands[0]

    monkeypatch.setattr(be.rt, "tune", Store())
    x, w = rand((2, 8, 10, 10), seed=37), rand((8, 1, 3, 3), seed=38)
    y = conv.conv(up(be, x), up(be, w), None, (1, 1), ((1, 1), (1, 1)), (1, 1), 8)
    np.testing.assert_allclose(down(be, y), TF.conv2d(torch.tensor(x), torch.tensor(w), padding=1, groups=8).numpy(),
                               rtol=1e-4, atol=1e-4)
    (op, key, cands, times), = calls
    assert op == conv.TUNE_OP and "|2d|" in key and "grouped" in key
    assert cands == [{"kind": "direct", "cot": 1}, {"kind": "gemm"}]  # one output channel per group
    assert all(t > 0 for t in times)
    conv.conv(up(be, rand((1, 64, 6, 6))), up(be, rand((64, 64, 3, 3))), None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    assert len(calls) == 1


# nd, N, C_in, C_out/groups, spatial, kernel, stride, padding, output_padding, dilation, groups
TCASES = [
    (1, 2, 4, 3, (7,), (3,), (2,), (1,), (1,), (1,), 1),
    (1, 1, 4, 2, (6,), (2,), (1,), (0,), (0,), (2,), 2),
    (2, 2, 3, 4, (5, 6), (3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 1),
    (2, 1, 4, 2, (4, 4), (2, 3), (1, 2), (0, 1), (0, 1), (2, 1), 2),
    (2, 3, 6, 1, (5, 4), (3, 3), (1, 1), (1, 1), (0, 0), (1, 1), 6),  # depthwise
    (2, 2, 5, 3, (4, 3), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), 1),  # 1x1: the GEMM alone
    (3, 1, 2, 2, (3, 4, 3), (2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (1, 1, 1), 1),
    (3, 2, 2, 3, (3, 3, 2), (3, 2, 2), (1, 2, 1), (1, 0, 1), (0, 1, 0), (1, 1, 2), 1),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", TCASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(TCASES)])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose(be, case, dtype, bias):
    nd, n, cin, cog, sp, k, st, p, op, dl, g = case
    x, w = rand((n, cin) + sp, dtype, 7), rand((cin, cog) + k, dtype, 8)
    b = rand((cog * g,), dtype, 9) if bias else None
    rd = ref_dtype(dtype)
    ref = getattr(TF, f"conv_transpose{nd}d")(
        torch.tensor(x, dtype=rd), torch.tensor(w, dtype=rd), None if b is None else torch.tensor(b, dtype=rd),
        stride=st, padding=p, output_padding=op, groups=g, dilation=dl).numpy()
    y = conv.conv_transpose(up(be, x), up(be, w), None if b is None else up(be, b), st, p, op, dl, g)
    assert y.shape == ref.shape and y.dtype.numpy == dtype
    np.testing.assert_allclose(down(be, y).astype(np.float64), ref, **TOL[dtype])


def test_seed_cnn_shapes(be):
    """The seed CNN's layers (1->64 on 28x28, 64->64 on 13x13): forward and both gradients, work-groups many."""
    for cin, hw, n in ((1, 28, 16), (64, 13, 8)):
        x, w, b = rand((n, cin, hw, hw), seed=10), rand((64, cin, 3, 3), seed=11) * 0.1, rand((64,), seed=12)
        tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        ty = TF.conv2d(tx, tw, torch.tensor(b))
        gy = rand(tuple(ty.shape), seed=13)
        ty.backward(torch.tensor(gy))
        pads = ((0, 0), (0, 0))
        y = conv.conv(up(be, x), up(be, w), up(be, b), (1, 1), pads, (1, 1), 1)
        np.testing.assert_allclose(down(be, y), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
        dx = conv.conv_input_grad(up(be, gy), up(be, w), x.shape, (1, 1), pads, (1, 1), 1)
        np.testing.assert_allclose(down(be, dx), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
        dw = conv.conv_weight_grad(up(be, x), up(be, gy), w.shape, (1, 1), pads, (1, 1), 1)
        np.testing.assert_allclose(down(be, dw), tw.grad.numpy(), rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("hw", [(9, 8), (20, 18)], ids=["whole-batch-gemm", "per-image-gemm"])
@pytest.mark.parametrize("bias", [True, False])
def test_batch_chunks(be, monkeypatch, groups, hw, bias):
    """A column budget smaller than the batch runs it in chunks (results written into slices of the output, weight
    gradients accumulated) with the same results, for both GEMM layouts."""
    x, w = rand((5, 4) + hw, seed=14), rand((6, 4 // groups, 3, 2), seed=15)
    b = rand((6,), seed=16) if bias else None
    st, pads, dl = (1, 2), ((1, 0), (2, 1)), (1, 1)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = tconv(2, tx, tw, None if b is None else torch.tensor(b), st, pads, dl, groups)
    gy = rand(tuple(ty.shape), seed=17)
    ty.backward(torch.tensor(gy))
    lsize = ty.shape[2] * ty.shape[3]
    assert (lsize >= conv._BATCHED_MIN_L) == (hw[0] > 10)
    per_item = 4 * 3 * 2 * lsize * 4  # bytes of one image's columns (the output is smaller)
    monkeypatch.setattr(conv, "_budget", lambda rt: 2 * per_item + 16 * lsize)  # chunks of 2, 2 and 1 images
    assert conv._chunk(be.rt, per_item // 4, 4, 5) == 2
    y = conv.conv(up(be, x, "strided"), up(be, w), None if b is None else up(be, b), st, pads, dl, groups)
    np.testing.assert_allclose(down(be, y), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    dx = conv.conv_input_grad(up(be, gy, "strided"), up(be, w), x.shape, st, pads, dl, groups)
    np.testing.assert_allclose(down(be, dx), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    dw = conv.conv_weight_grad(up(be, x), up(be, gy, "strided"), w.shape, st, pads, dl, groups)
    np.testing.assert_allclose(down(be, dw), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_split_k_weight_grad(be, monkeypatch):
    """A weight gradient with few output tiles splits its long reduction; the partial sums add up exactly."""
    x, w = rand((4, 2, 30, 30), seed=31), rand((3, 2, 3, 3), seed=32)
    gy = rand((4, 3, 28, 28), seed=33)
    tx, tw = torch.tensor(x), torch.tensor(w, requires_grad=True)
    TF.conv2d(tx, tw).backward(torch.tensor(gy))
    monkeypatch.setattr(conv, "_splits", lambda rt, k, tiles: 4 if k % 4 == 0 else 1)
    dw = conv.conv_weight_grad(up(be, x), up(be, gy), w.shape, (1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    np.testing.assert_allclose(down(be, dw), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    monkeypatch.setattr(conv, "_budget", lambda rt: 2 * 18 * 784 * 4)  # and in chunks: partials accumulate
    dw = conv.conv_weight_grad(up(be, x), up(be, gy), w.shape, (1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    np.testing.assert_allclose(down(be, dw), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    assert conv._splits(be.rt, 7, 1) == 1  # a prime reduction too short to cut stays whole


def test_single_item_batch_and_strided_weight(be):
    """N == 1 skips the reorder pass; a transposed weight view is read correctly."""
    x, w, b = rand((1, 4, 11, 10), seed=18), rand((4, 6, 3, 3), seed=19), rand((6,), seed=20)
    wt = np.swapaxes(w, 0, 1)  # (6, 4, 3, 3) as a strided view of w's buffer
    wh = arr.permute(up(be, w), (1, 0, 2, 3))
    assert not wh.is_contiguous
    ref = TF.conv2d(torch.tensor(x), torch.tensor(wt.copy()), torch.tensor(b), stride=2, padding=1).numpy()
    y = conv.conv(up(be, x), wh, up(be, b), (2, 2), ((1, 1), (1, 1)), (1, 1), 1)
    np.testing.assert_allclose(down(be, y), ref, rtol=1e-4, atol=1e-4)


def test_empty_reduction_gives_bias(be):
    """C_in == 0: nothing to sum, the output is the bias (and the gradients are empty or zero)."""
    x, w, b = np.zeros((2, 0, 5), np.float32), np.zeros((3, 0, 2), np.float32), rand((3,), seed=21)
    y = conv.conv(up(be, x), up(be, w), up(be, b), (1,), ((0, 0),), (1,), 1)
    np.testing.assert_array_equal(down(be, y), np.broadcast_to(b[None, :, None], (2, 3, 4)))
    gy = rand((2, 3, 4), seed=22)
    assert conv.conv_input_grad(up(be, gy), up(be, w), x.shape, (1,), ((0, 0),), (1,), 1).shape == x.shape
    assert conv.conv_weight_grad(up(be, x), up(be, gy), w.shape, (1,), ((0, 0),), (1,), 1).shape == w.shape


def test_public_api_and_bad_input():
    """F.conv2d on the device reaches conv() (same numbers as torch); shape errors come from core, typed."""
    dev = ember.Device.opencl(0)
    x, w = rand((2, 4, 9, 9), seed=23), rand((6, 2, 3, 3), seed=24)
    y = F.conv2d(ember.tensor(x, device=dev), ember.tensor(w, device=dev), stride=2, padding="valid", groups=2)
    ref = TF.conv2d(torch.tensor(x), torch.tensor(w), stride=2, groups=2).numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError, match="channels"):
        F.conv2d(ember.tensor(x, device=dev), ember.tensor(rand((6, 3, 3, 3)), device=dev))


def test_kernels_are_shared_across_shapes(be):
    """Sizes are kernel arguments: new shapes of the same rank and dtype build no new program."""
    def run(sp, k):
        x, w = rand((2, 3) + sp, seed=25), rand((4, 3) + k, seed=26)
        conv.conv(up(be, x), up(be, w), None, (1, 1), ((1, 1), (0, 0)), (1, 1), 1)
        conv.conv_input_grad(up(be, rand((2, 4, sp[0] + 3 - k[0], sp[1] + 1 - k[1]))), up(be, w), x.shape, (1, 1),
                             ((1, 1), (0, 0)), (1, 1), 1)

    run((6, 7), (2, 2))
    before = len(conv._sources)
    run((9, 5), (3, 2))
    assert len(conv._sources) == before


def test_autodiff_gradients_use_the_kernels():
    """Through the autodiff stack: x.grad, w.grad and b.grad of a strided, padded, grouped conv2d match torch."""
    if not any(d["name"] == "autodiff" for d in ember.info()["decorators"]):
        pytest.skip("the autodiff decorator is not installed")
    try:
        from ember_opencl import reduction  # noqa: F401 - the bias gradient is a sum
    except ImportError:
        pytest.skip("ember_opencl.reduction is not there yet (bias gradient)")
    dev = ember.Device.parse("opencl:0+autodiff")
    x, w, b = rand((2, 4, 8, 9), seed=27), rand((6, 2, 3, 2), seed=28), rand((6,), seed=29)
    ex, ew_, eb = (ember.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    kw = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    gy = rand(tuple(TF.conv2d(tx, tw, tb, **kw).shape), seed=30)
    F.conv2d(ex, ew_, eb, **kw).backward(ember.tensor(gy, device=dev))
    TF.conv2d(tx, tw, tb, **kw).backward(torch.tensor(gy))
    for e, t in ((ex, tx), (ew_, tw), (eb, tb)):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)
