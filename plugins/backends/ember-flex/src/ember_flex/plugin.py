"""ember plugin entry point for the flex backend (entry-point group ``ember``, name ``flex``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__


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
