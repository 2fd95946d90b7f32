"""The dtype flex's numpy kernels for core's extension ops compute in (recurrent layers, attention, training ops).

float32 and float64 compute in their own dtype; other floating dtypes (float16, bfloat16) compute in float32 and
the results are rounded back once, as PyTorch's CPU kernels accumulate half types in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["cast_back", "work_arrays"]


def work_arrays(*arrays: Any) -> tuple[np.dtype, list[Any]]:
    """(the dtype to compute in, decided by the first array; the arrays in it). None and bool masks pass through."""
    dt = arrays[0].dtype
    work = dt if dt in (np.float32, np.float64) else np.dtype(np.float32)
    return work, [a if a is None or a.dtype == work or a.dtype == np.bool_ else a.astype(work) for a in arrays]


def cast_back(dt: np.dtype, outs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The outputs in the caller's dtype ``dt`` (no copy for those already in it)."""
    return tuple(o if o.dtype == dt else o.astype(dt) for o in outs)
