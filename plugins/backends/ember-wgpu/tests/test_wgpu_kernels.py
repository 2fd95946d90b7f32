"""ember-wgpu kernels against torch: tree reductions, bitonic sort, tuned matmul (every candidate) and its tune
store, im2col convolution and its gradients, pooling, and the memory dry run.

Shapes are chosen to reach each kernel's paths (tree vs one invocation per output, chunked second pass, sort
lines shorter and longer than a workgroup block, several tiles with ragged edges) while staying small: lavapipe
runs shaders on the CPU.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember
from ember import dtypes as dt

torch = pytest.importorskip("torch")
runtime = pytest.importorskip("ember_wgpu.runtime")


@pytest.fixture(scope="module")
def dev() -> ember.Device:
    if runtime.device_count() == 0:
        pytest.skip("no WebGPU adapter (install a Vulkan driver)")
    return ember.Device.wgpu(0)


def _be(dev: ember.Device) -> Any:
    return dev.stack.base_backend


# -- reductions ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape", "dims"), [((70000,), (0,)), ((3, 5000), (1,)), ((2, 300, 5), (1,)),
                                             ((2, 3, 400), (0, 2)), ((5000, 3), (0,))],
                         ids=["long-1d", "rows", "middle", "two-dims", "many-short"])
def test_tree_reductions_match_torch(dev: ember.Device, shape: tuple[int, ...], dims: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    t, e = torch.from_numpy(x), ember.tensor(x, device=dev)
    np.testing.assert_allclose(e.sum(dims).numpy(), t.double().sum(dims).numpy(), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(e.amax(dims).numpy(), t.amax(dims).numpy())
    np.testing.assert_array_equal(e.amin(dims).numpy(), t.amin(dims).numpy())
    p = (1 + 1e-3 * x)
    np.testing.assert_allclose(ember.tensor(p, device=dev).prod(dims[0]).numpy(),
                               torch.from_numpy(p).double().prod(dims[0]).numpy(), rtol=1e-4)
    xi = rng.integers(-50, 50, shape)
    np.testing.assert_array_equal(ember.tensor(xi, device=dev).sum(dims).numpy(), xi.sum(axis=dims))
    b = xi > 45
    np.testing.assert_array_equal(ember.tensor(b, device=dev).any(dims[0]).numpy(), b.any(axis=dims[0]))
    np.testing.assert_array_equal(ember.tensor(b, device=dev).all(dims[0]).numpy(), b.all(axis=dims[0]))


@pytest.mark.parametrize("nan", [False, True], ids=["numbers", "with-nan"])
def test_tree_argmax_argmin_first_occurrence_and_nan(dev: ember.Device, nan: bool) -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 5, (3, 3000)).astype(np.float32)  # many ties: the first occurrence must win
    if nan:
        x[0, 1700] = x[0, 2500] = x[2, 9] = np.nan
    e, t = ember.tensor(x, device=dev), torch.from_numpy(x)
    for d in (0, 1):
        np.testing.assert_array_equal(e.argmax(d).numpy(), t.argmax(d).numpy())
        np.testing.assert_array_equal(e.argmin(d).numpy(), t.argmin(d).numpy())
    np.testing.assert_array_equal(ember.tensor(x.ravel(), device=dev).argmax().numpy(), t.argmax().numpy())


@pytest.mark.parametrize(("shape", "dim"), [((70000,), 0), ((3, 5000), 1), ((4000, 3), 0), ((5, 40), 1)],
                         ids=["long-1d", "long-rows", "long-columns", "short-rows"])
def test_chunked_scans_match_torch(dev: ember.Device, shape: tuple[int, ...], dim: int) -> None:
    rng = np.random.default_rng(13)
    x = rng.standard_normal(shape).astype(np.float32)
    e, t = ember.tensor(x, device=dev), torch.from_numpy(x)
    np.testing.assert_allclose(ember.cumsum(e, dim).numpy(), torch.cumsum(t.double(), dim).numpy(),
                               rtol=1e-5, atol=2e-3)
    signs = np.where(x > 0, 1.0, -1.0).astype(np.float32)  # exact products: a chunk-boundary slip shows
    np.testing.assert_array_equal(ember.cumprod(ember.tensor(signs, device=dev), dim).numpy(),
                                  torch.cumprod(torch.from_numpy(signs), dim).numpy())
    xi = rng.integers(-50, 50, shape).astype(np.int32)
    np.testing.assert_array_equal(ember.cumsum(ember.tensor(xi, device=dev), dim).numpy(),
                                  torch.cumsum(torch.from_numpy(xi), dim).numpy())
    if len(shape) == 2:  # a transposed (strided) view
        np.testing.assert_array_equal(ember.cumsum(ember.tensor(xi, device=dev).T, 1 - dim).numpy(),
                                      torch.cumsum(torch.from_numpy(xi).T, 1 - dim).numpy())


# -- sort ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape", "dim"), [((1,), 0), ((3, 17), 1), ((17, 3), 0), ((2, 513), 1), ((1500,), 0)],
                         ids=["one", "short-rows", "columns", "just-over-a-block", "several-blocks"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float16, np.bool_],
                         ids=["f32", "i32", "i64", "f16", "bool"])
def test_bitonic_sort_is_stable_like_torch(dev: ember.Device, shape: tuple[int, ...], dim: int,
                                           dtype: type) -> None:
    if dt.from_numpy_dtype(np.dtype(dtype)) not in _be(dev).supported_dtypes:
        pytest.skip(f"adapter lacks {np.dtype(dtype).name}")
    rng = np.random.default_rng(3)
    x = rng.integers(-4, 4, shape).astype(dtype)  # few distinct values: stability decides the indices
    if dtype is np.float32:
        x.reshape(-1)[::7] = np.nan
    for desc in (False, True):
        v, i = ember.sort(ember.tensor(x, device=dev), dim, desc, stable=True)
        tv, ti = torch.sort(torch.from_numpy(x), dim=dim, descending=desc, stable=True)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())


def test_sort_of_a_strided_view(dev: ember.Device) -> None:
    x = np.random.default_rng(4).standard_normal((700, 3)).astype(np.float32)
    v, i = ember.sort(ember.tensor(x, device=dev).T, 1)
    np.testing.assert_array_equal(v.numpy(), np.sort(x.T, axis=1))
    np.testing.assert_array_equal(i.numpy(), np.argsort(x.T, axis=1, kind="stable"))


# -- matmul and its tune store ---------------------------------------------------------------------------------------
def test_every_matmul_candidate_matches_numpy(dev: ember.Device) -> None:
    from ember_wgpu import array as arr
    from ember_wgpu import matmul as mm

    rt = _be(dev).rt
    rng = np.random.default_rng(5)
    for cfg in mm.CANDIDATES:
        for (M, K, N, nb) in [(1, 1, 1, 1), (33, 17, 45, 1), (70, 40, 3, 2)]:
            for dtype in (np.float32, np.int32):
                a = rng.integers(-3, 3, (nb, M, K)).astype(dtype)
                b = rng.integers(-3, 3, (nb, N, K)).astype(dtype)
                ha = arr.upload(rt, a, dt.from_numpy_dtype(a.dtype))
                hb = arr.permute(arr.upload(rt, b, dt.from_numpy_dtype(b.dtype)), (0, 2, 1))  # strided B
                got = arr.download(mm.matmul(ha, hb, cfg))
                np.testing.assert_array_equal(got, np.matmul(a, np.swapaxes(b, 1, 2)), err_msg=f"{cfg} {M, K, N}")


def test_matmul_tunes_once_and_persists(dev: ember.Device, tmp_path: Path) -> None:
    from ember_wgpu import matmul as mm
    from ember_wgpu.tune import TuneStore

    rt = _be(dev).rt
    saved = rt.__dict__.get("tune")
    rt.tune = TuneStore(tmp_path, rt.key)  # a private store: the test must not depend on the user's cache
    try:
        rng = np.random.default_rng(6)
        a = rng.standard_normal((128, 130)).astype(np.float32)
        b = rng.standard_normal((130, 129)).astype(np.float32)
        r = (ember.tensor(a, device=dev) @ ember.tensor(b, device=dev)).numpy()
        np.testing.assert_allclose(r, a @ b, rtol=1e-4, atol=1e-4)
        path = tmp_path / "wgpu" / rt.key / "tune.json"
        data = json.loads(path.read_text())
        assert data["format"] == 1
        table = data["entries"][mm.TUNE_OP]
        key = mm.shape_key(dt.float32, 128, 129, 130, 1)
        assert table[key] in [dict(c) for c in mm.CANDIDATES]
        # a new store (another process) reads the winner instead of timing again
        again = TuneStore(tmp_path, rt.key)
        assert again.tune(mm.TUNE_OP, key, list(mm.CANDIDATES), lambda cfg: pytest.fail("retuned")) == table[key]
    finally:
        if saved is not None:
            rt.tune = saved
        else:
            del rt.tune


def test_large_products_tune_on_a_corner(dev: ember.Device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ember_wgpu import matmul as mm
    from ember_wgpu.tune import TuneStore

    monkeypatch.setattr(mm, "TUNE_MIN_MACS", 1)
    monkeypatch.setattr(mm, "TUNE_BLOCK", (8, 8, 8))
    rt = _be(dev).rt
    saved = rt.__dict__.get("tune")
    rt.tune = TuneStore(tmp_path, rt.key)
    timed: list[tuple[int, ...]] = []
    real_timer = mm._timer
    monkeypatch.setattr(mm, "_timer", lambda a, b, out: (timed.append(a.shape + b.shape), real_timer(a, b, out))[1])
    try:
        rng = np.random.default_rng(12)
        a = rng.integers(-3, 3, (3, 20, 30)).astype(np.float32)
        b = rng.integers(-3, 3, (3, 30, 11)).astype(np.float32)
        r = (ember.tensor(a, device=dev) @ ember.tensor(b, device=dev)).numpy()
        np.testing.assert_array_equal(r, a @ b)
        assert timed == [(8, 8, 8, 8)]  # one batch element, an 8x8x8 corner
        assert mm.shape_key(dt.float32, 20, 11, 30, 3) in rt.tune._entries[mm.TUNE_OP]
    finally:
        if saved is not None:
            rt.tune = saved
        else:
            del rt.tune


def test_tune_store_survives_a_corrupt_file(tmp_path: Path) -> None:
    from ember_wgpu.tune import TuneStore

    path = tmp_path / "wgpu" / "k" / "tune.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    store = TuneStore(tmp_path, "k")
    assert store.get("op", "x") is None
    assert store.tune("op", "x", [{"a": 1}, {"a": 2}], lambda c: float(c["a"])) == {"a": 1}
    assert json.loads(path.read_text())["entries"]["op"]["x"] == {"a": 1}


# -- convolution and pooling -----------------------------------------------------------------------------------------
CONVS = [
    dict(x=(2, 4, 9, 8), w=(6, 2, 3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
    dict(x=(3, 3, 11), w=(5, 3, 4), stride=(3,), padding=(2,), dilation=(1,), groups=1),
    dict(x=(1, 2, 4, 5, 5), w=(2, 1, 2, 3, 2), stride=(1, 2, 1), padding=(0, 1, 1), dilation=(1, 1, 2), groups=2),
]


@pytest.mark.parametrize("case", CONVS, ids=["2d-groups", "1d", "3d"])
def test_conv_and_its_gradients_match_torch(dev: ember.Device, case: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(case["x"]).astype(np.float32)
    w = rng.standard_normal(case["w"]).astype(np.float32)
    b = rng.standard_normal(case["w"][0]).astype(np.float32)
    kw = {k: case[k] for k in ("stride", "padding", "dilation", "groups")}
    nd = len(case["x"]) - 2
    tfn = getattr(torch.nn.functional, f"conv{nd}d")
    tx, tw, tb = (torch.from_numpy(v).requires_grad_() for v in (x, w, b))
    ty = tfn(tx, tw, tb, **kw)
    gy = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.from_numpy(gy))
    ad = dev.autodiff()
    ex, ew, eb = (ember.tensor(v, device=ad, requires_grad=True) for v in (x, w, b))
    efn = getattr(ember.nn.functional, f"conv{nd}d")
    ey = efn(ex, ew, eb, **kw)
    np.testing.assert_allclose(ey.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    ey.backward(ember.tensor(gy, device=ad))
    for e, t in ((ex, tx), (ew, tw), (eb, tb)):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv_transpose_matches_torch(dev: ember.Device) -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    kw = dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), dilation=(1, 2), groups=2)
    ref = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), **kw)
    got = ember.nn.functional.conv_transpose2d(ember.tensor(x, device=dev), ember.tensor(w, device=dev),
                                               ember.tensor(b, device=dev), **kw)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_conv_runs_in_batch_chunks(dev: ember.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    from ember_wgpu import conv

    monkeypatch.setattr(conv, "COLS_ELEMS", 300)  # a few images per column matrix
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw, padding=1)
    ty.sum().backward()
    ad = dev.autodiff()
    ex, ew = ember.tensor(x, device=ad, requires_grad=True), ember.tensor(w, device=ad, requires_grad=True)
    ey = ember.nn.functional.conv2d(ex, ew, padding=1)
    ey.sum().backward()
    np.testing.assert_allclose(ey.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_pooling_kernels_match_torch(dev: ember.Device) -> None:
    F, tF = ember.nn.functional, torch.nn.functional
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 9, 10)).astype(np.float32)
    x[0, 0, 2, 3] = np.nan
    x[1, 2, 4:6, 4:6] = 7.0  # ties: the first maximum's index
    e, t = ember.tensor(x, device=dev), torch.from_numpy(x)
    v, i = F.max_pool2d(e, 3, stride=2, padding=1, dilation=1, ceil_mode=True, return_indices=True)
    tv, ti = tF.max_pool2d(t, 3, stride=2, padding=1, ceil_mode=True, return_indices=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    v, i = F.max_pool2d(e, (2, 3), stride=(1, 2), dilation=(2, 1), return_indices=True)
    tv, ti = tF.max_pool2d(t, (2, 3), stride=(1, 2), dilation=(2, 1), return_indices=True)
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    y = np.nan_to_num(x)
    e, t = ember.tensor(y, device=dev), torch.from_numpy(y)
    for cip in (True, False):
        np.testing.assert_allclose(F.avg_pool2d(e, 3, 2, 1, ceil_mode=True, count_include_pad=cip).numpy(),
                                   tF.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=cip).numpy(),
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.avg_pool2d(e, 2, divisor_override=3).numpy(),
                               tF.avg_pool2d(t, 2, divisor_override=3).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.adaptive_avg_pool2d(e, (4, 3)).numpy(), tF.adaptive_avg_pool2d(t, (4, 3)).numpy(),
                               rtol=1e-5, atol=1e-6)
    v, i = F.adaptive_max_pool2d(e, (4, 3), return_indices=True)
    tv, ti = tF.adaptive_max_pool2d(t, (4, 3), return_indices=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    xi = rng.integers(-9, 9, (2, 7, 8)).astype(np.int32)
    np.testing.assert_array_equal(F.max_pool1d(ember.tensor(xi, device=dev), 3, 2).numpy(),
                                  tF.max_pool1d(torch.from_numpy(xi).float(), 3, 2).int().numpy())


# -- memory dry run -------------------------------------------------------------------------------------------------
def test_dry_run_serves_repeated_steps_without_new_buffers(dev: ember.Device) -> None:
    ad = dev.autodiff()
    be = _be(dev)
    rng = np.random.default_rng(11)
    w = ember.tensor(rng.standard_normal((64, 32)).astype(np.float32), device=ad, requires_grad=True)
    x = ember.tensor(rng.standard_normal((16, 64)).astype(np.float32), device=ad)

    def step() -> None:
        nonlocal w
        (x @ w).relu().sum().backward()
        with ember.no_grad():
            w = (w - 0.01 * w.grad).requires_grad_()

    step()
    with be.memory_dry_run() as stats:
        step()
    assert stats["allocations"] > 0 and stats["classes"] > 0 and stats["planned_bytes"] > 0
    gc.collect()
    before = be.memory_report()
    assert before["plan_slots"] > 0
    for _ in range(3):
        step()
    after = be.memory_report()
    assert after["raw_allocations"] == before["raw_allocations"]  # every buffer came from the cache
    assert after["plan_allocations"] > before["plan_allocations"]
