"""A pytest plugin that runs ember's conformance kit on CuPyBackend without a GPU: backend ``cupyemu`` is the real
CuPyBackend class (every contract method, its host logic and its kernel launches) with numpy standing in for CuPy
and each kernel launch running the program the backend asked for on PoCL (see test_cupy_kernels_pocl.py).

    PYTHONPATH=packages/ember-cupy/tests python -m pytest -p cupy_pocl_kit --pyargs ember.testing \\
        --ember-device=cupyemu                      # or a kit module, e.g. ember.testing.test_nn_conv

What it cannot cover: the CUDA/HIP rewrite of the programs (``ember kernels check``), CuPy's own functions (numpy
runs in their place; the names are checked in test_cupy_names.py), streams, pinned memory and the memory pool.
numpy returns scalars where CuPy returns 0-d arrays; the stand-in turns them back into arrays.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import sys
import threading
import types
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.plugins import CONTRACT_VERSION, hookimpl
from ember.plugins.manager import registry
from ember_cupy import backend as cupy_backend
from ember_cupy.backend import CuPyBackend

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_cupy_kernels_pocl import _PoCL  # noqa: E402


def _arr(r: Any) -> Any:
    """numpy's scalar results as the 0-d arrays CuPy returns."""
    return np.asarray(r) if isinstance(r, np.generic) else r


def _numpy_cupy() -> Any:
    """numpy with CuPy's conventions where the backend relies on them (0-d arrays, asnumpy, the memory names)."""
    ns: dict[str, Any] = {}
    for k in dir(np):
        if k.startswith("__"):
            continue
        v = getattr(np, k)
        if callable(v) and not isinstance(v, type):
            ns[k] = functools.wraps(v)(lambda *a, _f=v, **kw: _arr(_f(*a, **kw)))
        else:
            ns[k] = v
    shim = types.SimpleNamespace(**ns)

    def asnumpy(a: Any, stream: Any = None, blocking: bool = True, out: Any = None) -> np.ndarray:
        if out is None:
            return np.array(a)
        np.copyto(out, a)
        return out

    shim.asnumpy = asnumpy
    shim.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=MemoryError),
                                      runtime=types.SimpleNamespace(memGetInfo=lambda: (1 << 30, 2 << 30)))
    shim.get_default_pinned_memory_pool = lambda: types.SimpleNamespace(n_free_blocks=lambda: 0)
    return shim


_POCL: list[_PoCL] = []


class EmulatedCuPyBackend(CuPyBackend):
    """CuPyBackend over numpy + PoCL (see the module docstring)."""

    def __init__(self, index: int = 0) -> None:  # no super().__init__: it would open a CUDA device
        if not _POCL:
            _POCL.append(_PoCL())
        pocl = _POCL[0]
        self.index, self.name, self.platform = index, "cupyemu", "cuda"
        self.cp = _numpy_cupy()
        self.device, self.stream = contextlib.nullcontext(), contextlib.nullcontext()
        self.pool = types.SimpleNamespace(used_bytes=lambda: 0, total_bytes=lambda: 0, n_free_blocks=lambda: 0,
                                          get_limit=lambda: 0)
        self.supported_dtypes = frozenset(d for d in dt.ALL_DTYPES if d is not dt.bfloat16)
        self._modules, self._peak, self._peak_reserved, self._key, self._offset = {}, 0, 0, 0, 0
        self._staged, self._dry_run_active = [], False
        self._lock = threading.Lock()
        self.__dict__["_multiprocessors"] = 8
        self.__dict__["_cudnn"] = None

        def launch(source: str, name: str, n: int, args: Any, shared_mem: int = 0) -> None:
            blocks = max(1, min(-(-n // cupy_backend._BLOCK), cupy_backend._MAX_BLOCKS))
            pocl.run(source, name, blocks, cupy_backend._BLOCK, list(args), shared_mem)

        def launch_groups(source: str, name: str, groups: int, block: int, args: Any, shared_mem: int = 0) -> None:
            pocl.run(source, name, groups, block, list(args), shared_mem)

        self._launch = launch  # type: ignore[method-assign]
        self._launch_groups = launch_groups  # type: ignore[method-assign]

    def describe(self) -> str:
        return f"cupyemu:{self.index} (CuPyBackend on numpy + PoCL)"

    def sync(self) -> None:
        """Launches run synchronously on PoCL."""

    def getitem(self, h: Any, key: tuple[Any, ...]) -> Any:
        return _arr(super().getitem(h, key))

    def reduce(self, op: str, h: Any, dims: tuple[int, ...], keepdim: bool) -> Any:
        return _arr(super().reduce(op, h, dims, keepdim))

    def argreduce(self, op: str, h: Any, dim: int | None, keepdim: bool) -> Any:
        return _arr(super().argreduce(op, h, dim, keepdim))

    def from_numpy(self, array: np.ndarray) -> Any:
        self._check_dtype(dt.from_numpy_dtype(array.dtype), "from_numpy")
        return np.array(array)  # a copy: device memory is not the caller's array

    def to_numpy(self, h: Any) -> np.ndarray:
        return np.array(h)


class _Plugin:
    @hookimpl
    def register_backends(self, register: Any) -> None:
        register("cupyemu", lambda index=0, **options: EmulatedCuPyBackend(index), contract=CONTRACT_VERSION,
                 kind="gpu", priority=-100, is_available=lambda: 1,
                 description="CuPyBackend emulated on numpy + PoCL (tests only)")


def pytest_configure(config: Any) -> None:
    """Register the ``cupyemu`` backend before the kit resolves ``--ember-device``."""
    registry.ensure_loaded()
    registry.register_plugin(_Plugin(), name="cupyemu")
