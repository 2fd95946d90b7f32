"""ember-wgpu: device selection, the missing-driver error, dtype refusals, memory report, shader caches, kernels.

The kit (``pytest --pyargs ember.testing --ember-device=wgpu``) checks the contract; these tests check what is
specific to this backend. They skip when no WebGPU adapter is present (except the missing-driver tests).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.errors import DeviceError, DTypeError, OutOfMemoryError

runtime = pytest.importorskip("ember_wgpu.runtime")

needs_adapter = pytest.mark.skipif(runtime.device_count() == 0, reason="no WebGPU adapter (install a Vulkan driver)")


@pytest.fixture(scope="module")
def dev() -> ember.Device:
    if runtime.device_count() == 0:
        pytest.skip("no WebGPU adapter (install a Vulkan driver)")
    return ember.Device.wgpu(0)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


# -- device selection and the missing driver --------------------------------------------------------------------------
def test_missing_driver_raises_device_error_naming_what_to_install() -> None:
    code = ("import ember\n"
            "try:\n    ember.Device.wgpu(0)\nexcept ember.DeviceError as e:\n    print('ERR', e)\n")
    r = _run(code, EMBER_WGPU_DISABLE="1")
    assert "ERR" in r.stdout, r.stderr
    assert "mesa-vulkan-drivers" in r.stdout and "Vulkan" in r.stdout


def test_info_works_without_driver() -> None:
    r = _run("import ember_wgpu.plugin as p; print(p.plugin_info()); import ember_wgpu.runtime as r; "
             "print(r.device_count(), r.device_kind(0))", EMBER_WGPU_DISABLE="1")
    assert r.returncode == 0, r.stderr
    assert "0 emulated" in r.stdout


@needs_adapter
def test_lavapipe_ranks_emulated_and_index_out_of_range() -> None:
    kinds = {runtime.device_kind(i) for i in range(runtime.device_count())}
    assert kinds <= {"gpu", "emulated"}
    adapters = runtime.list_adapters("high")
    for i, a in enumerate(adapters):
        assert runtime.device_kind(i) == ("emulated" if a.info["adapter_type"] == "CPU" else "gpu")
    with pytest.raises(DeviceError, match="only"):
        ember.Device.wgpu(runtime.device_count())


@needs_adapter
def test_power_option() -> None:
    low = ember.Device.wgpu(0, power="low")
    x = ember.tensor([1.0, 2.0], device=low)
    assert (x * 2).tolist() == [2.0, 4.0]
    with pytest.raises(DeviceError, match="power"):
        ember.tensor([1.0], device=ember.Device.wgpu(0, power="medium"))
    with pytest.raises(DeviceError, match="unknown option"):
        ember.tensor([1.0], device=ember.Device.wgpu(0, colour="red"))


# -- dtypes -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [dt.float64, dt.bfloat16], ids=lambda d: d.name)
def test_unsupported_dtypes_are_refused_with_a_typed_error(dev: ember.Device, dtype: dt.DType) -> None:
    assert not dev.supports_dtype(dtype)
    with pytest.raises(DTypeError, match=f"{dtype.name}.*wgpu"):
        dev.stack.base_backend.full((2,), 1, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.float16, np.int8, np.uint8,
                                   np.int16])
def test_round_trip_and_arithmetic(dev: ember.Device, dtype: type) -> None:
    if not dev.supports_dtype(dt.from_numpy_dtype(np.dtype(dtype))):
        pytest.skip(f"adapter lacks {np.dtype(dtype).name}")
    a = (np.arange(7) % 3).astype(dtype)  # odd length: float16 transfers are padded to whole words
    x = ember.tensor(a, device=dev)
    np.testing.assert_array_equal(x.numpy(), a)
    np.testing.assert_array_equal((x[1:6:2]).numpy(), a[1:6:2])
    if dtype is not np.bool_:
        np.testing.assert_array_equal((x + x).numpy(), a + a)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_small_integers_wrap_like_torch(dev: ember.Device, dtype: type) -> None:
    torch = pytest.importorskip("torch")
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, 3, 0], dtype=dtype)
    x, t = ember.tensor(a, device=dev), torch.from_numpy(a)
    np.testing.assert_array_equal((x + x).numpy(), (t + t).numpy())
    np.testing.assert_array_equal((x * 3).numpy(), (t * 3).numpy())
    np.testing.assert_array_equal((~x).numpy(), (~t).numpy())


def test_int64_beyond_32_bits(dev: ember.Device) -> None:
    a = np.array([2 ** 40 + 3, -(2 ** 50), 7], dtype=np.int64)
    x = ember.tensor(a, device=dev)
    np.testing.assert_array_equal((x * 3 + 1).numpy(), a * 3 + 1)
    np.testing.assert_array_equal((x // 5).numpy(), a // 5)


# -- kernels against numpy / torch --------------------------------------------------------------------------------
def test_math_matches_torch(dev: ember.Device) -> None:
    torch = pytest.importorskip("torch")
    a = np.linspace(-3, 3, 101, dtype=np.float32)
    x, t = ember.tensor(a, device=dev), torch.from_numpy(a)
    for name in ("exp", "expm1", "log1p", "tanh", "sigmoid", "erf", "erfc", "sinh", "asinh", "atan"):
        got = getattr(ember, name)(x if name != "log1p" else x.abs()).numpy()
        ref = getattr(torch, name)(t if name != "log1p" else t.abs()).numpy()
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6, err_msg=name)
    b = np.linspace(-0.99, 0.99, 51, dtype=np.float32)
    np.testing.assert_allclose(ember.erfinv(ember.tensor(b, device=dev)).numpy(),
                               torch.erfinv(torch.from_numpy(b)).numpy(), rtol=1e-5, atol=1e-6)


def test_matmul_reduce_sort(dev: ember.Device) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 37, 29)).astype(np.float32)
    b = rng.standard_normal((29, 18)).astype(np.float32)
    x, y = ember.tensor(a, device=dev), ember.tensor(b, device=dev)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.sum(dim=(0, 2)).numpy(), a.sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)
    v = np.array([3.0, np.nan, 1.0, 3.0, -2.0], dtype=np.float32)
    s, i = ember.sort(ember.tensor(v, device=dev), descending=True, stable=True)
    np.testing.assert_array_equal(i.numpy(), [1, 0, 3, 2, 4])
    assert np.isnan(s.numpy()[0])


def test_random_is_reproducible_and_in_range(dev: ember.Device) -> None:
    dev.seed(3)
    u1 = ember.rand(1000, device=dev).numpy()
    dev.seed(3)
    u2 = ember.rand(1000, device=dev).numpy()
    np.testing.assert_array_equal(u1, u2)
    assert u1.min() >= 0.0 and u1.max() < 1.0 and abs(u1.mean() - 0.5) < 0.05
    z = ember.randn(4000, device=dev).numpy()
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1.0) < 0.1
    r = ember.randint(-5, 5, (2000,), device=dev).numpy()
    assert r.min() == -5 and r.max() == 4


# -- memory and caches ----------------------------------------------------------------------------------------------
def test_memory_report_fields_and_reuse(dev: ember.Device) -> None:
    be = dev.stack.base_backend
    x = ember.ones(1000, device=dev)
    del x
    before = be.memory_report()
    for field in ("in_use", "reserved", "peak", "peak_reserved", "held", "cached", "allocations", "reuses",
                  "raw_allocations", "raw_releases", "live_blocks", "small_allocations", "large_allocations"):
        assert field in before, field
    y = ember.ones(1000, device=dev)
    after = be.memory_report()
    assert after["reuses"] > before["reuses"]  # the freed buffer of the same class came back
    assert after["in_use"] >= 4000 and after["reserved"] >= after["held"]
    del y
    with be.memory_dry_run() as stats:
        (ember.ones(300, device=dev) * 2).sum()
    assert stats["allocations"] > 0 and "planned_bytes" in stats


def test_out_of_memory_is_typed(dev: ember.Device) -> None:
    be = dev.stack.base_backend
    too_big = be.rt.pool.max_alloc // 4 + 1024
    with pytest.raises(OutOfMemoryError, match="wgpu"):
        be.full((too_big,), 0, dt.float32)


def test_pipeline_cache_hits(dev: ember.Device) -> None:
    be = dev.stack.base_backend
    x = ember.tensor(np.ones(5, np.float32), device=dev)
    (x * 3).numpy()
    stats0 = dict(be.rt.stats)
    (ember.tensor(np.ones(9, np.float32), device=dev) * 3).numpy()  # new shape, same kernel
    stats1 = be.rt.stats
    assert stats1["pipelines"] == stats0["pipelines"]
    assert stats1["pipeline_hits"] > stats0["pipeline_hits"]


def test_sync_waits(dev: ember.Device) -> None:
    x = ember.ones((64, 64), device=dev)
    y = x @ x
    dev.sync()
    assert float(y[0, 0].item()) == 64.0


# -- fusion -----------------------------------------------------------------------------------------------------------
def _fusion_kernel() -> object:
    from ember.ir import Instr, Kernel

    f32, b, i32 = dt.float32, dt.bool_, dt.int32
    body = (Instr("load", (0,), f32), Instr("load", (1,), f32), Instr("scalar", (0,), f32),
            Instr("binary", ("mul", 0, 2), f32), Instr("binary", ("add", 3, 1), f32),
            Instr("binary", ("gt", 4, 2), b), Instr("where", (5, 4, 0), f32), Instr("unary", ("tanh", 6), f32),
            Instr("cast", (7,), i32), Instr("scalar", (1,), i32), Instr("binary", ("floor_divide", 8, 9), i32))
    return Kernel(rank=2, inputs=(f32, f32), scalars=2, body=body, outputs=(7, 10))


def test_fusion_compile_matches_the_reference_interpreter(dev: ember.Device) -> None:
    from ember.ir import interpret

    be = dev.stack.base_backend
    kernel = _fusion_kernel()
    run = be.fusion_compile(kernel)
    assert run is not None
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((5, 7)) * 4).astype(np.float32)
    c = (rng.standard_normal((1, 7)) * 4).astype(np.float32)
    ha, hc = be.from_numpy(a), be.permute(be.from_numpy(np.ascontiguousarray(c.T)), (1, 0))  # a strided input
    got = run([ha, hc], [0.5, -3], (5, 7), [None, None])
    ref = interpret(kernel, be, [ha, hc], [0.5, -3], (5, 7), [None, None])
    np.testing.assert_allclose(be.to_numpy(got[0]), be.to_numpy(ref[0]), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(be.to_numpy(got[1]), be.to_numpy(ref[1]))
    # an output written in place into an input's buffer (a view): read from a copy, write through the strides
    target = be.from_numpy(np.zeros((7, 5), np.float32))
    view = be.permute(target, (1, 0))
    run([ha, hc], [0.5, -3], (5, 7), [view, None])
    np.testing.assert_allclose(be.to_numpy(target).T, be.to_numpy(ref[0]), rtol=1e-6, atol=1e-7)


def test_fusion_declines_reductions_and_missing_dtypes(dev: ember.Device) -> None:
    from ember.ir import Instr, Kernel

    be = dev.stack.base_backend
    body = (Instr("load", (0,), dt.float32), Instr("unary", ("exp", 0), dt.float32))
    assert be.fusion_compile(Kernel(2, (dt.float32,), 0, body, (1,), ("sum", (1,)))) is None
    body64 = (Instr("load", (0,), dt.float32), Instr("cast", (0,), dt.float64))
    assert be.fusion_compile(Kernel(1, (dt.float32,), 0, body64, (1,))) is None


def test_threads_reading_while_garbage_cycles_free_memory(dev: ember.Device) -> None:
    """Reads resolve on wgpu-py's poll thread, where a collected Block returns its buffer to the pool: no thread may
    hold the pool's lock while waiting for a read (this used to deadlock)."""
    import gc
    import threading

    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(20):
                a = rng.standard_normal(257).astype(np.float32)
                x = ember.tensor(a, device=dev)
                cycle: list[object] = [x * 2]
                cycle.append(cycle)  # garbage only the cycle collector frees
                np.testing.assert_allclose((x + 1).numpy(), a + 1, rtol=1e-6)
                del cycle
                gc.collect()
        except BaseException as exc:  # reported below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread is still waiting"
    assert not errors, errors
