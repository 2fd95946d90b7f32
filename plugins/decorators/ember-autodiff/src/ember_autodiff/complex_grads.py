"""PyTorch's convention for gradients through complex values.

For a real loss L and a complex z, PyTorch's ``z.grad`` is dL/d(conj z) times two: through an op with
derivative f'(z) the incoming gradient g becomes ``g * conj(f'(z))``. The real-valued rules of this package
compute ``g * f'(z)``; conjugating before and after gives torch's form, ``conj(rule(conj(g)))``, and is a no-op on
real values. A real operand of a complex op (promoted by a recorded cast) gets the real part back through the
cast's rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def is_complex(be: Any, h: Any) -> bool:
    return be.dtype_of(h).is_complex


def conj(be: Any, h: Any) -> Any:
    """The conjugate of a complex handle. The contract has no conj op yet: the values take the host route (free on a
    host backend, the only kind with complex dtypes so far)."""
    return be.from_numpy(np.ascontiguousarray(np.conj(be.to_numpy(h))))


def real_part(be: Any, h: Any) -> Any:
    """The real part of a complex handle (the gradient of the real value a cast promoted to complex)."""
    return be.from_numpy(np.ascontiguousarray(np.real(be.to_numpy(h))))


def conjugated(be: Any, vjp: Callable[[Any], Sequence[Any]]) -> Callable[[Any], tuple[Any, ...]]:
    """``vjp`` in torch's complex convention: ``conj(vjp(conj(g)))`` on every complex gradient."""

    def run(g: Any) -> tuple[Any, ...]:
        return tuple(r if r is None or not is_complex(be, r) else conj(be, r) for r in vjp(conj(be, g)))

    return run
