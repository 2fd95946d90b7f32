"""The fuzz engine: abstract cases, their materialisation in torch and in ember, and the verdict.

A case is an op from the table (``fuzz_ops.OPS``) plus abstract arguments: :class:`Arr` (an array that becomes a
torch tensor or an ember tensor on the device under test), :class:`DT` (a dtype name), or plain Python values that
both libraries receive unchanged (scalars, lists, junk). The same call runs once in torch 2.13 and once in ember
and is classified:

* ``same``  -- both return, and the results agree (shape, dtype, values to tolerance);
* ``typed`` -- torch raises and ember raises an :class:`ember.errors.EmberError` subclass;
* ``allowed`` -- exactly one side raises and the case is on the commented allow-list in ``fuzz_ops.ALLOWED``
  (a deliberate ember extension, or a stricter typed check);
* ``raw``   -- ember raises an exception that is not an EmberError (whatever torch does);
* ``wrong`` -- the results differ, or exactly one side raises (ember accepts what torch refuses, or refuses with
  a typed error what torch computes);
* ``hang``  -- the ember call did not return within the time bound.

Only ``raw``, ``wrong`` and ``hang`` are failures. The engine never imports a plugin: devices are reached through
their strings (``"flex"``, ``"flex+autodiff"``, ...).
"""

from __future__ import annotations

import faulthandler
import math
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as TF

import ember
import ember.nn.functional as EF
from ember.errors import EmberError

#: the devices fuzzed, as device strings (never through a plugin module)
DEVICES = ("flex", "flex+fusion(enabled=False)", "flex+autodiff", "opencl")
#: examples per op and device; the CI default is small, ``nox -s fuzz`` sets 2000
EXAMPLES = int(os.environ.get("EMBER_FUZZ_EXAMPLES", "3"))
#: seconds one ember call may take before it counts as a hang (soft bound, SIGALRM) ...
SOFT_TIMEOUT = float(os.environ.get("EMBER_FUZZ_TIMEOUT", "60"))  # generous: 2 loaded CI cores, kernel builds
#: ... and before faulthandler dumps every thread's stack and ends the process (a call stuck in C code)
HARD_TIMEOUT = SOFT_TIMEOUT * 3

OUTCOMES = ("same", "typed", "allowed", "raw", "wrong", "hang")
FAILURES = ("raw", "wrong", "hang")

torch.set_num_threads(1)  # two CI cores; the arrays are tiny, threads only add noise


# -- abstract arguments -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arr:
    """An array argument: becomes ``torch.from_numpy(data)`` or ``ember.tensor(data, device=...)``."""

    data: np.ndarray
    grad: bool = False  # requires_grad (float dtypes, gradient checks only)

    def __repr__(self) -> str:
        d = self.data
        body = np.array2string(d, threshold=24, precision=3, separator=",").replace("\n", "")
        return f"Arr({body}, dtype={d.dtype.name}, shape={d.shape}{', grad' if self.grad else ''})"


@dataclass(frozen=True)
class DT:
    """A dtype argument by name: ``torch.<name>`` / ``ember.<name>``."""

    name: str

    def __repr__(self) -> str:
        return f"dtype.{self.name}"


@dataclass
class Case:
    """One fuzzed call: the op's ``call(ns, *args, **kwargs)`` with abstract arguments."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: indices may legitimately differ (ties, several NaNs): int64 outputs compare by shape and dtype only
    loose_indices: bool = False
    #: values are unspecified (empty, ...): compare shape and dtype only
    shape_only: bool = False
    tol: dict[str, float] | None = None

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return "(" + ", ".join(parts) + ")"


class NS:
    """What an op's ``call`` sees: the library (``m``), its functional module (``F``), creation keywords (``kw``:
    the device for ember, nothing for torch) and whether it is torch."""

    def __init__(self, is_torch: bool, device: str | None = None) -> None:
        self.is_torch = is_torch
        self.m: Any = torch if is_torch else ember
        self.F: Any = TF if is_torch else EF
        self.kw: dict[str, Any] = {} if is_torch else {"device": device}
        self.device = device

    def dtype(self, name: str) -> Any:
        return getattr(self.m, name)


def to_torch(x: Any, leaves: list[Any] | None = None) -> Any:
    if isinstance(x, Arr):
        t = torch.from_numpy(np.array(x.data, copy=True))
        if x.grad and leaves is not None:
            t.requires_grad_(True)
            leaves.append(t)
        return t
    if isinstance(x, DT):
        return getattr(torch, x.name)
    if isinstance(x, list):
        return [to_torch(v, leaves) for v in x]
    if isinstance(x, tuple):
        return tuple(to_torch(v, leaves) for v in x)
    if isinstance(x, dict):
        return {k: to_torch(v, leaves) for k, v in x.items()}
    return x


def to_ember(x: Any, device: str, leaves: list[Any] | None = None) -> Any:
    if isinstance(x, Arr):
        t = ember.tensor(np.array(x.data, copy=True), device=device)
        if x.grad and leaves is not None:
            t.requires_grad_(True)
            leaves.append(t)
        return t
    if isinstance(x, DT):
        return getattr(ember, x.name)
    if isinstance(x, list):
        return [to_ember(v, device, leaves) for v in x]
    if isinstance(x, tuple):
        return tuple(to_ember(v, device, leaves) for v in x)
    if isinstance(x, dict):
        return {k: to_ember(v, device, leaves) for k, v in x.items()}
    return x


# -- results ------------------------------------------------------------------------------------------------------
def _dtype_name(d: Any) -> str:
    s = str(d)
    return s.split(".", 1)[1] if "." in s else s


def normalize(x: Any) -> Any:
    """A library-neutral picture of a result: ``("T", dtype, ndarray)`` for tensors, lists for sequences,
    Python scalars as they are."""
    if isinstance(x, torch.Tensor):
        d = x.detach()
        dname = _dtype_name(d.dtype)
        if d.dtype == torch.bfloat16:
            d = d.float()
        return ("T", dname, d.resolve_conj().numpy().copy())
    if isinstance(x, ember.Tensor):
        dname = x.dtype.name
        a = np.asarray(x.detach().to(dtype=ember.float32) if dname == "bfloat16" else x.detach())
        return ("T", "bool" if dname == "bool_" else dname, np.array(a, copy=True))
    if isinstance(x, (tuple, list)):  # torch.Size, named tuples (sort, topk, max) and plain sequences alike
        return [normalize(v) for v in x]
    if isinstance(x, (np.generic,)):
        return x.item()
    if isinstance(x, (ember.DType, torch.dtype)):
        return ("dtype", _dtype_name(x))
    return x


TOL = {
    "float64": {"rtol": 1e-7, "atol": 1e-9},
    "float32": {"rtol": 2e-4, "atol": 2e-5},
    "float16": {"rtol": 1e-2, "atol": 2e-3},
    "bfloat16": {"rtol": 2e-2, "atol": 1e-2},
}


def differ(a: Any, b: Any, case: Case, path: str = "out") -> str | None:
    """None when torch's ``a`` and ember's ``b`` (normalized) agree, else a sentence saying where they differ."""
    if isinstance(a, tuple) and a and a[0] == "T":
        if not (isinstance(b, tuple) and b and b[0] == "T"):
            return f"{path}: torch gives a tensor, ember {type(b).__name__} {b!r:.80}"
        _, da, xa = a
        _, db, xb = b
        if xa.shape != xb.shape:
            return f"{path}: shape torch {xa.shape} vs ember {xb.shape}"
        if da != db:
            return f"{path}: dtype torch {da} vs ember {db}"
        if case.shape_only or (case.loose_indices and da == "int64"):
            return None
        if xa.dtype.kind in "fc":
            # the tolerance of the result's dtype, or of the least precise float input if that is coarser (a
            # float64 result of float16 data), or the case's own if coarser still (accumulating ops)
            tol = dict(TOL.get(da, TOL["float32"]))
            for extra in (TOL.get(_least_precise(case) or "", {}), case.tol or {}):
                for k, v in extra.items():
                    tol[k] = max(tol[k], v)
            fa, fb = xa.astype(np.float64), xb.astype(np.float64)
            ok = np.isclose(fb, fa, equal_nan=True, **tol)
            # same-signed infinities are equal; isclose already says so, NaN positions must match exactly
            if not ok.all():
                bad = np.argwhere(~ok)[:3]
                idx = [tuple(int(i) for i in ix) for ix in bad]
                return (f"{path}: values differ at {idx}: torch {[fa[i] for i in idx]} vs ember "
                        f"{[fb[i] for i in idx]}")
            return None
        if not np.array_equal(xa, xb):
            bad = np.argwhere(xa != xb)[:3]
            idx = [tuple(int(i) for i in ix) for ix in bad]
            return f"{path}: values differ at {idx}: torch {[xa[i] for i in idx]} vs ember {[xb[i] for i in idx]}"
        return None
    if isinstance(a, list):
        if not isinstance(b, list):
            return f"{path}: torch gives a sequence, ember {type(b).__name__}"
        if len(a) != len(b):
            return f"{path}: torch gives {len(a)} items, ember {len(b)}"
        for i, (u, v) in enumerate(zip(a, b)):
            d = differ(u, v, case, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, float) and isinstance(b, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return None
        if math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7) or a == b:
            return None
        return f"{path}: torch {a!r} vs ember {b!r}"
    if a != b or type(a) is not type(b) and not (isinstance(a, int) and isinstance(b, int)):
        return f"{path}: torch {a!r} ({type(a).__name__}) vs ember {b!r} ({type(b).__name__})"
    return None


def _least_precise(case: Case) -> str | None:
    """The least precise float dtype among the case's array arguments (None when it has none)."""
    order = ("float64", "float32", "bfloat16", "float16")
    found: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, Arr) and x.data.dtype.name in order:
            found.append(x.data.dtype.name)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)

    walk(case.args)
    walk(case.kwargs)
    return max(found, key=order.index) if found else None


# -- time bound ---------------------------------------------------------------------------------------------------
class Hang(BaseException):  # noqa: N818 - a BaseException so that no `except Exception` in ember swallows it
    """Raised into the main thread when an ember call outlives the soft time bound."""


@contextmanager
def time_bound(seconds: float | None = None) -> Iterator[None]:
    """Bound the block: after ``seconds`` a :class:`Hang` is raised in it (main thread, POSIX: SIGALRM, which
    stops Python-level loops and recursion); after ``HARD_TIMEOUT`` faulthandler dumps every thread and ends the
    process (a call stuck in C code, where no signal handler runs)."""
    seconds = SOFT_TIMEOUT if seconds is None else seconds
    faulthandler.dump_traceback_later(max(HARD_TIMEOUT, seconds * 3), exit=True)
    use_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    old = None
    if use_alarm:
        def _raise(signum: int, frame: Any) -> None:
            raise Hang(f"no result after {seconds:.0f} s")

        old = signal.signal(signal.SIGALRM, _raise)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        faulthandler.cancel_dump_traceback_later()


# -- running a case -----------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str  # one of OUTCOMES
    op: str
    device: str
    case: Case
    detail: str = ""
    torch_side: str = ""  # "ok" or the exception torch raised
    ember_side: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    @property
    def class_key(self) -> str:
        """The failure class: ``op | outcome what | torch <exception type or ok> | ember <exception type or ok>``,
        where *what* says how a ``wrong`` differs (accepts, refuses, dtype, shape, values)."""
        d = self.detail
        what = ""
        if self.kind == "wrong":
            what = (" accepts" if d.startswith("ember accepts") or "runs where torch" in d else
                    " refuses" if d.startswith("ember refuses") or "refuses what" in d else
                    " dtype" if "dtype torch" in d else " shape" if "shape torch" in d else
                    " values" if "values differ" in d else " other")
        return (f"{self.op} | {self.kind}{what} | torch {self.torch_side.split(':', 1)[0]} | "
                f"ember {self.ember_side.split(':', 1)[0]}")

    def describe(self) -> str:
        return (f"[{self.kind}] {self.op}{self.case!r} on {self.device}: torch -> {self.torch_side}; "
                f"ember -> {self.ember_side}" + (f"; {self.detail}" if self.detail else ""))


def _exc(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg[:160]}"


def _torch_run(op: Any, case: Case, with_grad: bool) -> tuple[Any, BaseException | None, list[Any]]:
    leaves: list[Any] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            args = to_torch(case.args, leaves if with_grad else None)
            kwargs = to_torch(case.kwargs, leaves if with_grad else None)
            return op.call(NS(True), *args, **kwargs), None, leaves
        except Exception as e:  # torch's own refusal: RuntimeError, TypeError, IndexError, ValueError, ...
            return None, e, leaves


def _ember_run(op: Any, case: Case, device: str, with_grad: bool) -> tuple[Any, BaseException | None, list[Any]]:
    leaves: list[Any] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with time_bound():
                args = to_ember(case.args, device, leaves if with_grad else None)
                kwargs = to_ember(case.kwargs, device, leaves if with_grad else None)
                out = op.call(NS(False, device), *args, **kwargs)
                norm = normalize(out)  # reading the result back is part of the call (lazy backends run here)
            return (out, norm), None, leaves
        except Hang as e:
            return None, e, leaves
        except RecursionError as e:
            return None, e, leaves
        except Exception as e:
            return None, e, leaves


def run_case(op: Any, case: Case, device: str) -> list[Outcome]:
    """Run ``case`` of ``op`` in torch and on ``device``; the forward outcome, then (on a differentiable device,
    for ops marked ``grad``) the gradient outcome."""
    with_grad = bool(op.grad) and device_is_differentiable(device) and _has_grad_leaf(case)
    t_out, t_err, t_leaves = _torch_run(op, case, with_grad)
    e_res, e_err, e_leaves = _ember_run(op, case, device, with_grad)
    o = Outcome("same", op.name, device, case, torch_side="ok" if t_err is None else _exc(t_err),
                ember_side="ok" if e_err is None else _exc(e_err))
    if isinstance(e_err, Hang):
        o.kind = "hang"
        return [o]
    if e_err is not None and not isinstance(e_err, EmberError):
        o.kind = "raw"
        return [o]
    if t_err is not None:
        if e_err is not None:
            o.kind = "typed"
            return [o]
        reason = op.allowed(case, t_err, None) if op.allowed else None
        o.kind = "allowed" if reason else "wrong"
        o.detail = reason or "ember accepts a call torch refuses"
        return [o]
    if e_err is not None:
        reason = op.allowed(case, None, e_err) if op.allowed else None
        o.kind = "allowed" if reason else "wrong"
        o.detail = reason or "ember refuses a call torch computes"
        return [o]
    try:
        d = differ(normalize(t_out), e_res[1], case)
    except Exception as e:  # a result ember cannot even convert to numpy
        d = f"comparing the results failed: {_exc(e)}"
    if d:
        o.kind, o.detail = "wrong", d
        return [o]
    out = [o]
    if with_grad:
        out.append(_grad_outcome(op, case, device, t_out, t_leaves, e_res[0], e_leaves))
    return out


def device_is_differentiable(device: str) -> bool:
    return bool(ember.Device.parse(device).stack.differentiable)


def _has_grad_leaf(case: Case) -> bool:
    def walk(x: Any) -> bool:
        if isinstance(x, Arr):
            return x.grad
        if isinstance(x, (list, tuple)):
            return any(walk(v) for v in x)
        if isinstance(x, dict):
            return any(walk(v) for v in x.values())
        return False

    return walk(case.args) or walk(case.kwargs)


def _first_float(out: Any, tensor_type: type) -> Any:
    if isinstance(out, tensor_type):
        return out if out.is_floating_point() else None
    if isinstance(out, (tuple, list)):
        for v in out:
            f = _first_float(v, tensor_type)
            if f is not None:
                return f
    return None


def _grad_outcome(op: Any, case: Case, device: str, t_out: Any, t_leaves: list[Any], e_out: Any,
                  e_leaves: list[Any]) -> Outcome:
    """Backward of ``(out * w).sum()`` (w fixed, seeded by the output's shape) in both libraries; the leaves'
    gradients must agree (an empty leaf's gradient is an empty tensor, as in torch)."""
    name = op.name + ".grad"
    o = Outcome("same", name, device, case)
    t_y = _first_float(t_out, torch.Tensor)
    e_y = _first_float(e_out, ember.Tensor)
    if t_y is None or not t_y.requires_grad:
        o.torch_side = "no differentiable output"
        o.ember_side = "skipped"
        return o  # nothing to differentiate: counted as same (torch has no gradient either)
    w = np.random.default_rng(len(t_y.shape) * 31 + t_y.numel()).uniform(0.5, 1.5, tuple(t_y.shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            (t_y * torch.from_numpy(w).to(t_y.dtype)).sum().backward()
            t_err = None
        except Exception as e:
            t_err = e
        e_err = None
        try:
            with time_bound():
                (e_y * ember.tensor(w, dtype=e_y.dtype, device=device)).sum().backward()
                e_grads = [normalize(leaf.grad) for leaf in e_leaves]
        except Hang as e:
            e_err = e
        except Exception as e:
            e_err = e
    o.torch_side = "ok" if t_err is None else _exc(t_err)
    o.ember_side = "ok" if e_err is None else _exc(e_err)
    if isinstance(e_err, Hang):
        o.kind = "hang"
    elif e_err is not None and not isinstance(e_err, EmberError):
        o.kind = "raw"
    elif t_err is not None:
        o.kind = "typed" if e_err is not None else "wrong"
        o.detail = "" if e_err is not None else "ember's backward runs where torch's refuses"
    elif e_err is not None:
        o.kind, o.detail = "wrong", "ember's backward refuses what torch's computes"
    else:
        t_grads = [normalize(leaf.grad) for leaf in t_leaves]
        low = _least_precise(case)  # a float64 leaf combined with float16 data: float16's tolerance
        tol = op.grad_tol or ({"rtol": 1e-6, "atol": 1e-8} if low == "float64" else TOL.get(low or "", None))
        gcase = Case(case.args, case.kwargs, tol=tol)
        d = differ(t_grads, e_grads, gcase, "grad")
        if d:
            o.kind, o.detail = "wrong", d
    return o


# -- device availability ------------------------------------------------------------------------------------------
_availability: dict[str, str | None] = {}


def unavailable(device: str) -> str | None:
    """None when ``device`` works here, else why not (e.g. no OpenCL platform on this machine)."""
    if device not in _availability:
        try:
            ember.zeros(2, device=device).numpy()
            _availability[device] = None
        except EmberError as e:
            _availability[device] = f"device {device!r} is not available here: {_exc(e)}"
    return _availability[device]
