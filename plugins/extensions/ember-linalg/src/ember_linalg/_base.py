"""Shared machinery of ember-linalg's ops: the error type, argument checks, and the host kernel.

Every op is an ``ember.backend_extension`` whose kernel is one *host* function on numpy arrays (numpy.linalg /
scipy.linalg, i.e. LAPACK). On flex the handles are numpy arrays already, so the kernel runs in place; on any other
backend (OpenCL, the ``toy`` example, a third-party one) the same kernel copies the inputs to the host with
``backend.to_numpy``, runs LAPACK and copies the results back with ``backend.from_numpy``. That kernel is registered
for a backend the first time an op runs there (:func:`call`), so a backend installed later gets it too, and autodiff
still records one node per op with the op's vjp (a composition that round-trips through numpy would lose gradients).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ember
from ember import dtypes as dt
from ember.dispatch import stack_chain
from ember.errors import DTypeError, EmberError, ShapeError
from ember.extension import ExtensionOp, TensorSpec

__all__ = ["LinAlgError", "batch_shape", "call", "check_float", "check_square", "host_op", "is_zero", "real_dtype"]

FLOATS = (dt.float32, dt.float64)
#: the dtypes the solvers and decompositions take (torch.linalg's: float32/float64 and complex64/complex128)
COMPLEX = tuple(d for d in (getattr(dt, "complex64", None), getattr(dt, "complex128", None)) if d is not None)
LINALG_DTYPES = FLOATS + COMPLEX


def real_dtype(d: dt.DType) -> dt.DType:
    """The real dtype of the same precision (float32 for complex64, float64 for complex128; reals unchanged): the
    dtype of eigenvalues of Hermitian matrices, singular values, norms and log|det|."""
    if d in COMPLEX:
        return dt.float32 if d.name == "complex64" else dt.float64
    return d


class LinAlgError(EmberError, RuntimeError):
    """A linear-algebra routine failed on a valid input: a singular matrix for ``inv``/``solve``/``lu_factor``, a
    matrix that is not positive-definite for ``cholesky`` (``torch.linalg.LinAlgError``'s role). The message names
    the function and, for batches, the batch element (flat index) that failed."""


# -- argument checks (used by the shape rules, so bad input fails before any kernel runs) --------------------------
def check_float(fn: str, *specs: TensorSpec, names: Sequence[str] = ()) -> None:
    """Refuse anything but float32/float64/complex64/complex128 (torch's message: "Expected a floating point or
    complex tensor as input"), and tensors of different dtypes."""
    for i, s in enumerate(specs):
        if s.dtype not in LINALG_DTYPES:
            what = names[i] if i < len(names) else "input"
            raise DTypeError(f"Expected a floating point or complex tensor (float32, float64, complex64 or "
                             f"complex128) as {what}. Got {s.dtype.name} (shape {s.shape})")
    if len({s.dtype for s in specs}) > 1:
        shown = " and ".join(f"{names[i] if i < len(names) else 'input'} of dtype {s.dtype.name}"
                             for i, s in enumerate(specs))
        raise DTypeError(f"Expected all inputs to have the same dtype, but found {shown}")


def check_matrix(fn: str, s: TensorSpec, name: str = "A") -> None:
    if s.ndim < 2:
        raise ShapeError(f"The input tensor {name} must have at least 2 dimensions, got shape {s.shape}")


def check_square(fn: str, s: TensorSpec, name: str = "A") -> None:
    """Refuse anything but (batches of) square matrices, in torch's words."""
    check_matrix(fn, s, name)
    if s.shape[-1] != s.shape[-2]:
        raise ShapeError(f"{name} must be batches of square matrices, but they are {s.shape[-2]} by "
                         f"{s.shape[-1]} matrices (shape {s.shape})")


def batch_shape(fn: str, *shapes: tuple[int, ...], names: Sequence[str] = ("A", "B")) -> tuple[int, ...]:
    """The broadcast of the batch shapes (each shape given without its matrix dims), or a ShapeError naming them."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        shown = ", ".join(f"{n} {s}" for n, s in zip(names, shapes))
        raise ShapeError(f"the batch dimensions of the inputs do not broadcast: {shown}") from None


# -- the host kernel and its registration per backend ---------------------------------------------------------------
def _kernel_of(fn: Callable[..., Any], op_name: str) -> Callable[..., Any]:
    """The kernel for every backend: positional args are the op's tensors (handles), keywords its options."""

    def kernel(backend: Any, *handles: Any, **kwargs: Any) -> Any:
        arrays = [np.asarray(backend.to_numpy(h)) for h in handles]
        out = fn(*arrays, **kwargs)
        if isinstance(out, tuple):
            return tuple(backend.from_numpy(np.asarray(o, order="C")) for o in out)
        return backend.from_numpy(np.asarray(out, order="C"))

    kernel.__name__ = f"{op_name.replace('.', '_')}_lapack"
    kernel.__doc__ = f"{op_name}: LAPACK on the host (in place on flex's numpy arrays, copied elsewhere)"
    return kernel


_HOST: dict[str, Callable[..., Any]] = {}


def _backend_name(device: Any) -> str:
    return list(stack_chain(device.stack))[-1].name


def call(op: ExtensionOp, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` after making sure the backend under the tensors' device has its kernel (the host kernel,
    registered on first use there)."""
    dev = next(a for a in args if isinstance(a, ember.Tensor)).device
    name = _backend_name(dev)
    if name not in op.kernels:
        op.kernel(name)(_HOST[op.name])
    return op(*args, **kwargs)


def host_op(name: str, output: Callable[..., Any], *, differentiable: bool = True,
            doc: str = "") -> Callable[[Callable[..., Any]], ExtensionOp]:
    """Declare ``linalg.<name>`` (not published by name: :mod:`ember_linalg.api` publishes the torch-signature
    wrappers) with the host function it decorates as its kernel on flex and, on first use, on any other backend.

    The composition (what runs when no kernel is registered for a device's backend) registers the host kernel there
    and calls the op again, so it records its vjp under autodiff; for ops without gradients (integer or
    non-differentiable outputs) it computes on host copies of the detached inputs.
    """
    full = f"linalg.{name}"

    def register(fn: Callable[..., Any]) -> ExtensionOp:
        op_ref: list[ExtensionOp] = []

        if differentiable:
            def composition(*args: Any, **kwargs: Any) -> Any:
                return call(op_ref[0], *args, **kwargs)
        else:
            def composition(*args: Any, **kwargs: Any) -> Any:
                dev = next(a for a in args if isinstance(a, ember.Tensor)).device
                out = fn(*(a.detach().numpy() for a in args), **kwargs)
                if isinstance(out, tuple):
                    return tuple(ember.tensor(np.asarray(o, order="C"), device=dev) for o in out)
                return ember.tensor(np.asarray(out, order="C"), device=dev)

        composition.__doc__ = doc or fn.__doc__
        composition.__name__ = name
        composition.__module__ = fn.__module__
        composition.__qualname__ = f"{name}_composition"
        op = ember.backend_extension(full, output=output, publish=False)(composition)
        op_ref.append(op)
        _HOST[full] = _kernel_of(fn, full)
        op.kernel("flex")(_HOST[full])
        return op

    return register


# -- helpers for the vjps ---------------------------------------------------------------------------------------------
def is_zero(g: ember.Tensor | None) -> bool:
    """True for a missing gradient or one that is all zeros: autodiff passes zeros for outputs nothing read, and
    torch's formulas skip those terms (e.g. ``svd``'s singular vectors when only the singular values are used),
    which also keeps them finite where the skipped terms would divide by zero."""
    if g is None or math.prod(g.shape) == 0:
        return True
    return not bool((g != 0).any().item())


def batch_index(shape: tuple[int, ...], flat: int) -> str:
    """torch's "(Batch element k): " prefix for batched inputs (empty for a single matrix)."""
    return f"(Batch element {flat}): " if len(shape) > 2 else ""
