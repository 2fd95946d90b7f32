"""ember plugin entry point for the flex backend (entry-point group ``ember``, name ``flex``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__
from .attention_kernels import register as _register_attention_kernels
from .norm_kernels import register as _register_norm_kernels
from .quant_kernels import register as _register_quant_kernels
from .rnn_kernels import register as _register_rnn_kernels
from .train_kernels import register as _register_train_kernels

# numpy kernels for core's recurrent-layer ops (ember.ops.recurrent), registered whenever ember loads this plugin
_register_rnn_kernels()
# ... and for core's attention ops (ember.ops.attention): fused scaled-dot-product attention and its backward
_register_attention_kernels()
# ... and for core's training ops (ember.ops.train_kernels): cross-entropy, batch norm (training), Adam's update
_register_train_kernels()
# ... and for core's one-op GELU and layer norm (ember.ops.train_kernels), forward and backward
_register_norm_kernels()
# ... and for core's 4-bit quantization ops (ember.quantization.ops): NF4/FP4 quantize, dequantize, on-the-fly matmul
_register_quant_kernels()


def _factory(index: int = 0, **options: Any) -> Any:
    from .backend import FlexBackend

    if index != 0:
        from ember.errors import DeviceError

        raise DeviceError(f"flex has a single device (index 0), got index {index}")
    if options:
        from ember.errors import DeviceError

        raise DeviceError(f"flex takes no options, got {sorted(options)}")
    return FlexBackend(index)


@hookimpl
def register_backends(register: Callable[..., None]) -> None:
    register(
        "flex",
        _factory,
        contract=CONTRACT,
        kind="cpu",
        priority=0,
        # handles are ndarrays: from_numpy adopts the array and to_numpy returns it, so flex can be the host device
        host=True,
        description=f"numpy CPU backend (ember-flex {__version__})",
    )


def set_num_threads(n: int) -> None:
    """Limit flex's thread pools to n threads: its own pool for large elementwise ops and reductions
    (:mod:`ember_flex.threads`; 1 runs them serially), the BLAS (and OpenMP) libraries numpy and scipy use, through
    threadpoolctl, and numexpr's pool (fused kernels). All are process-wide, as ``torch.set_num_threads`` is."""
    import scipy.linalg  # noqa: F401 - scipy ships its own BLAS, loaded lazily: load it so its pool is limited too
    from threadpoolctl import threadpool_limits

    from .threads import set_num_threads as set_pool_threads

    set_pool_threads(n)

    threadpool_limits(limits=n)  # applies at once and stays (only its context-manager form restores on exit)
    try:
        import numexpr
    except ImportError:  # numexpr is a dependency; a broken install only loses fusion, which already says why
        return
    numexpr.set_num_threads(n)


@hookimpl
def register_backend_traits(register: Callable[..., None]) -> None:
    # numpy on the host: bfloat16 autocast and PyTorch's CPU autocast lists; every kernel is deterministic
    register("flex", autocast_ops="cpu", set_num_threads=set_num_threads)


@hookimpl
def plugin_info() -> dict[str, Any]:
    import numpy as np

    info: dict[str, Any] = {"numpy": np.__version__}
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        info["blas"] = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older numpy: no dict mode
        pass
    return info


# `ember bench NAME` finds these through the entry-point group ``ember.benchmarks`` (this package's pyproject.toml);
# the scripts live in the source checkout's benchmarks/ folder, not in the wheel.
OVERHEAD_BENCHMARK = {
    "description": "per-op eager overhead (a + b on 1,000 float32, flex vs numpy vs PyTorch) and cold import time",
    "script": "overhead.py",
}
MICRO_BENCHMARK = {
    "description": "micro-benchmarks: per-op overhead, matmul vs numpy sgemm, conv2d, elementwise, reductions, copy",
    "script": "micro.py",
}
SUITE_BENCHMARK = {
    "description": "the full suite: seed CNN and transformer training and inference, micro-benchmarks, peak memory",
    "script": "suite.py",
}
THREADS_BENCHMARK = {
    "description": "flex's thread pool by size: a+b, exp, sum, sum(dim=-1), 1e2..1e7 float32, flex vs PyTorch",
    "script": "threads.py",
}
PORTS_BENCHMARK = {
    "description": "train-step time of the PyTorch ports (examples/ports): torch vs ember fused and unfused",
    "script": "ports.py",
}
