"""The OpenCL backend's plumbing: device discovery and ranking, views, generated elementwise kernels, memory API."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Device
from ember.errors import DeviceError
from ember.plugins.manager import registry

ember_opencl = pytest.importorskip("ember_opencl")
from ember_opencl import runtime  # noqa: E402

if not runtime.list_devices():
    pytest.skip("no OpenCL platform on this machine (install pocl-opencl-icd)", allow_module_level=True)


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device.opencl(0)


def put(a: np.ndarray, dev: Device) -> ember.Tensor:
    return ember.tensor(a, device=dev)


# -- discovery and ranking -----------------------------------------------------------------------------------------
def test_cpu_opencl_is_not_preferred_over_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_DEVICE", raising=False)
    spec = registry.backend("opencl")
    if spec.kind_of(0) == "gpu":
        pytest.skip("this machine has an OpenCL GPU, which is rightly preferred")
    assert Device.default() == Device.flex()


def test_an_opencl_gpu_is_preferred_over_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_DEVICE", raising=False)
    monkeypatch.setattr(runtime, "device_kind", lambda index: "gpu")
    assert Device.default() == Device.opencl(0)


def test_gpus_are_listed_first() -> None:
    kinds = [runtime._type_name(d) for d in runtime.list_devices()]
    assert kinds == sorted(kinds, key=runtime._TYPE_RANK.__getitem__)


def test_missing_runtime_says_how_to_install_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "list_devices", lambda: ())
    with pytest.raises(DeviceError) as err:
        Device("opencl", 3)._checked()
    assert "pocl-opencl-icd" in str(err.value) and "no OpenCL runtime" in str(err.value)
    with pytest.raises(DeviceError, match="pocl-opencl-icd"):
        runtime.get_device(0)


def test_index_beyond_the_devices_found(dev: Device) -> None:
    n = len(runtime.list_devices())
    with pytest.raises(DeviceError, match=f"only {n} opencl device"):
        Device.opencl(n)


def test_info_lists_the_opencl_devices(dev: Device) -> None:
    info = ember.info()
    assert any(b["name"] == "opencl" and b["devices"] >= 1 for b in info["backends"])
    assert "opencl" in dev.stack.describe()


def test_options_are_rejected() -> None:
    with pytest.raises(DeviceError, match="opencl could not be created|takes no options"):
        _ = Device("opencl", 0, (("tile", 8),)).stack


# -- views ---------------------------------------------------------------------------------------------------------
def test_views_share_memory_and_report_byte_strides(dev: Device) -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = put(a, dev)
    t = x.permute(2, 0, 1)
    assert t._h.block is x._h.block and t._h.strides == (4, 48, 16)
    np.testing.assert_array_equal(t.numpy(), a.transpose(2, 0, 1))
    s = x[1, ::2, None, 1:]
    assert s._h.block is x._h.block
    np.testing.assert_array_equal(s.numpy(), a[1, ::2, None, 1:])
    e = put(a[:, :1, :], dev).expand(2, 5, 4)
    assert e._h.estrides[1] == 0
    np.testing.assert_array_equal(e.numpy(), np.broadcast_to(a[:, :1, :], (2, 5, 4)))


def test_reshape_views_when_strides_allow_and_copies_otherwise(dev: Device) -> None:
    a = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    x = put(a, dev)
    sliced = x[:, 1:3]  # (3, 2, 5), rows of 5 contiguous: the last two dims merge into a view
    v = sliced.reshape(3, 10)
    assert v._h.block is x._h.block
    np.testing.assert_array_equal(v.numpy(), a[:, 1:3].reshape(3, 10))
    tr = x.permute(2, 1, 0)
    c = tr.reshape(20, 3)  # not viewable: a copy
    assert c._h.block is not x._h.block
    np.testing.assert_array_equal(c.numpy(), a.transpose(2, 1, 0).reshape(20, 3))
    with pytest.raises(ember.errors.ShapeError):
        tr.view(60)


def test_zero_d_and_empty_tensors(dev: Device) -> None:
    z = put(np.float32(2.5), dev)
    assert z.shape == () and (z * 2).item() == 5.0
    e = put(np.zeros((0, 3), np.float32), dev)
    assert (e + 1).shape == (0, 3) and (e + 1).numpy().shape == (0, 3)


# -- generated elementwise kernels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (1000,), (257, 3), (70001,)])
def test_grid_stride_covers_every_element(dev: Device, shape: tuple[int, ...]) -> None:
    rt = dev.stack.rt
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal((put(a, dev) * 3).numpy(), a * np.float32(3))
    assert rt.grid(10**7)[0][0] <= rt.ew_local * rt.ew_max_groups  # the grid is capped: items loop


@pytest.mark.parametrize("ndim", [2, 5, 10])
def test_strided_broadcast_operands_of_every_rank(dev: Device, ndim: int) -> None:
    # ranks 2-3, 4-8 and beyond take different kernels; a transposed operand never collapses to fewer dims
    rng = np.random.default_rng(ndim)
    shape = tuple(int(n) for n in rng.integers(2, 4, ndim))
    a = rng.standard_normal(shape)
    row = rng.standard_normal(shape[0])
    y = put(a, dev).permute(*reversed(range(ndim)))
    np.testing.assert_array_equal((y + put(row, dev)).numpy(), a.transpose() + row)
    key = tuple(slice(None, None, 2) if d % 2 else slice(1, None) for d in range(ndim))
    np.testing.assert_array_equal((put(a, dev)[key] * 2).numpy(), a[key] * 2)


def test_inplace_ops_through_overlapping_views(dev: Device) -> None:
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    x = put(a, dev)
    x += x.T  # reads a snapshot of x.T, never a half-updated x
    np.testing.assert_array_equal(x.numpy(), a + a.T)
    y = put(a, dev)
    y[1:] = y[:-1]
    expect = a.copy()
    expect[1:] = a[:-1]
    np.testing.assert_array_equal(y.numpy(), expect)


def test_bfloat16_and_float16_round_to_nearest_even(dev: Device) -> None:
    import ml_dtypes

    rng = np.random.default_rng(1)
    a = np.concatenate([rng.standard_normal(1000).astype(np.float32) * 1e3,
                        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40, 65504.0, 65520.0], np.float32)])
    x = put(a, dev)
    np.testing.assert_array_equal(x.to(ember.bfloat16).numpy().view(np.uint16) & 0x7FFF | 0,
                                  a.astype(ml_dtypes.bfloat16).view(np.uint16) & 0x7FFF | 0)
    with np.errstate(over="ignore"):
        want = a.astype(np.float16)
    np.testing.assert_array_equal(x.to(ember.float16).numpy(), want)


def test_erfinv_is_accurate_in_float32_and_float64(dev: Device) -> None:
    from scipy.special import erfinv

    p = np.linspace(-0.999999, 0.999999, 20001)
    for d, rtol in ((np.float32, 3e-6), (np.float64, 1e-13)):
        x = p.astype(d)
        np.testing.assert_allclose(put(x, dev).erfinv().numpy(), erfinv(x.astype(np.float64)), rtol=rtol, atol=rtol)


def test_int_shifts_follow_torch(dev: Device) -> None:
    torch = pytest.importorskip("torch")
    a = np.array([1, -8, 127, -128, 5], np.int8)
    s = np.array([0, 1, 7, 8, 9], np.int8)
    for op in ("bitwise_left_shift", "bitwise_right_shift"):
        got = getattr(ember, op)(put(a, dev), put(s, dev)).numpy()
        want = getattr(torch, op)(torch.tensor(a), torch.tensor(s)).numpy()
        np.testing.assert_array_equal(got, want, err_msg=op)


# -- memory ---------------------------------------------------------------------------------------------------------
def test_memory_report_and_dry_run(dev: Device) -> None:
    def step() -> None:
        x = ember.ones(256, 256, device=dev)
        y = (x * 2 + 1).exp()
        z = y @ x
        z.sum().item()

    step()
    with dev.memory_dry_run() as stats:
        step()
    assert stats, "the dry run records statistics"
    report = dev.memory_report()
    for key in ("in_use", "reserved", "peak", "kernels"):
        assert key in report
    before = report["raw_allocations"]
    step()
    assert dev.memory_report()["raw_allocations"] == before  # the planned step allocates nothing new


def test_out_of_memory_names_requested_and_available_sizes(dev: Device) -> None:
    with pytest.raises(ember.OutOfMemoryError, match=r"1099511627776 bytes \(1024.0 GiB\)"):
        ember.zeros(2**38, device=dev)
    # beyond what is left on the device: a pool over the real context, with a small capacity, trims then gives up
    from ember_opencl.memory import MemoryPool

    pool = MemoryPool(dev.stack.rt.ctx, capacity=8 << 20, label="opencl:test")
    keep = [pool.allocate(3 << 20), pool.allocate(3 << 20)]
    with pytest.raises(ember.OutOfMemoryError, match="available") as err:
        keep.append(pool.allocate(3 << 20))
    assert "opencl:test" in str(err.value) and "3.0 MiB" in str(err.value)
    del keep
    assert pool.allocate(3 << 20).nbytes == 3 << 20  # freed blocks are reusable afterwards
    assert (ember.ones(4, device=dev) * 2).sum().item() == 8.0


def test_threads_launch_the_same_kernels_without_racing(dev: Device) -> None:
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((64, 33)).astype(np.float32) for _ in range(8)]

    def work(a: np.ndarray) -> np.ndarray:
        x = put(a, dev)
        for _ in range(20):
            x = (x * 1.5 + 0.25).tanh()
        return x.numpy()

    def reference(a: np.ndarray) -> np.ndarray:
        return work(a)

    expected = [reference(a) for a in inputs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(work, inputs))
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_generated_sources_are_identical_across_processes() -> None:
    # the on-disk cache is keyed by the source text: nothing in it may depend on set order (PYTHONHASHSEED)
    import hashlib
    import os
    import subprocess
    import sys

    script = (
        "import hashlib; from ember import dtypes as dt; from ember_opencl import elementwise as ew\n"
        "from ember_opencl.ctypes_ import ctype\n"
        "h = hashlib.sha256()\n"
        "for d in dt.ALL_DTYPES:\n"
        "    for plan in (ew._unary_plan('abs', d), ew._binary_plan('add', d, d)):\n"
        "        desc = ((ctype(d), True),) * (1 if plan in ew._unary_plans.values() else 2)\n"
        "        for layout in ('linear', 'strided', 'chunked', 'linear_chunked'):\n"
        "            h.update(ew._map_source(plan[3], desc, 3, layout).encode())\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and len(digests.pop()) == len(hashlib.sha256().hexdigest())


def test_float_tanh_is_within_two_ulps_everywhere(dev: Device) -> None:
    """ember's own float tanh (polynomial below 0.55, exp-based above): accuracy across the branch point, tiny and
    huge values, signed zeros and the non-finite values."""
    rng = np.random.default_rng(7)
    xs = np.concatenate([
        rng.standard_normal(200_000) * 3, np.linspace(0.5, 0.6, 20_001), np.geomspace(1e-30, 1e-3, 1000),
        -np.geomspace(1e-30, 1e-3, 1000), [0.0, -0.0, 9.0, 50.0, -50.0, 3e38, np.inf, -np.inf, np.nan],
    ]).astype(np.float32)
    got = put(xs, dev).tanh().numpy()
    ref = np.tanh(xs.astype(np.float64))
    finite = ~np.isnan(ref)
    ulps = np.abs(got[finite].astype(np.float64) - ref[finite]) / np.spacing(np.abs(ref[finite]).astype(np.float32))
    assert ulps.max() <= 2.0, f"tanh off by {ulps.max():.2f} ulp at x={xs[finite][ulps.argmax()]!r}"
    assert np.isnan(got[-1]) and got[-3] == 1.0 and got[-2] == -1.0
    assert np.signbit(got[np.flatnonzero(xs == 0)]).tolist() == [False, True]
