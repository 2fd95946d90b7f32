"""Running relative-form graphs (:func:`ember.ir.relative_form`) on a backend stack: the receiving side shared by
every channel that carries op records (ember-router's in-process executor, ember-remote's server sessions).

A graph key is ``(ext, body, outs)``: ``body`` is a sequence of ``(op, positions, shapes, dtypes, args)`` records
whose ``positions`` name an input (``("in", k)``) or an earlier value (``("v", k)``) and whose ``args`` hold
:class:`~ember.ir.Ref` for tensor arguments and :class:`~ember.ir.Placeholder` for bound scalars. ``outs`` names the
positions the graph gives back. These helpers are message-agnostic: they take handles, dtypes and scalars, and the
caller decides where names resolve (``method``) and how extension records run. Validation of untrusted graphs is the
caller's job and must happen before :func:`run_graph` (a server checks positions, refs and limits first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .capture import _NOT_RECORDED, _TUPLE_RESULTS, SCALAR_OPERANDS, SHAPE_RULES, _NoRule
from .decorator import CONTRACT_METHODS
from .dtypes import DType
from .errors import DeviceError
from .ir import OpRecord, Placeholder, Ref, Scalar, Shape

if TYPE_CHECKING:
    from .capture import ExtensionArgs

__all__ = ["NOT_RECORDED", "OPTIONAL_KERNELS", "RECORDED_METHODS", "TUPLE_RESULTS", "graph_interface", "lower_arg",
           "optional_kernel_shape", "optional_kernels", "output_specs", "record_args", "recording_method", "ref_for",
           "resolve_args", "returns_tuple", "run_extension_record", "run_graph"]

#: contract methods that return a tuple of handles: always (None), or when the argument at that position is true
#: (``return_indices``); the table :mod:`ember.capture` records with
TUPLE_RESULTS: dict[str, int | None] = _TUPLE_RESULTS
#: contract methods a recording stack does not turn into records: plumbing, reads, host transfers and random
#: streams, which each recorder handles itself
NOT_RECORDED: frozenset[str] = _NOT_RECORDED
#: the contract methods a recording stack records, sorted
RECORDED_METHODS: tuple[str, ...] = tuple(sorted(CONTRACT_METHODS - NOT_RECORDED))
#: backend methods outside the contract that autodiff uses when the backend has them (the contract's "optional
#: backward kernels"); a recorder offers them where the receiving device has them, so gradients keep its bits
OPTIONAL_KERNELS: tuple[str, ...] = ("conv_input_grad", "conv_weight_grad", "max_pool_backward")


def optional_kernels(stack: Any) -> tuple[str, ...]:
    """The :data:`OPTIONAL_KERNELS` that ``stack`` (a device's backend stack) has."""
    return tuple(k for k in OPTIONAL_KERNELS if callable(getattr(stack, k, None)))


def optional_kernel_shape(args: Sequence[Any]) -> Shape:
    """The result shape of an optional kernel call: ``conv_input_grad(grad_y, w, x_shape, ...)`` and
    ``max_pool_backward(grad, indices, x_shape, ...)`` give ``x_shape``, ``conv_weight_grad(x, grad_y, w_shape, ...)``
    gives ``w_shape`` (all in the dtype of their first argument)."""
    return tuple(int(n) for n in args[2])

_SCALARS = (bool, int, float)
#: builds the error a malformed reference raises, from a message (None: no range checks, trusted input)
ErrorFactory = Callable[[str], Exception]


def returns_tuple(name: str, args: tuple[Any, ...]) -> bool:
    """Whether contract method ``name`` called with ``args`` returns a tuple of handles (see :data:`TUPLE_RESULTS`)."""
    flag = TUPLE_RESULTS.get(name, -1)
    return flag is None or (flag >= 0 and len(args) > flag and bool(args[flag]))


def recording_method(name: str, doc: str) -> Callable[..., Any]:
    """A method for a recording stack class: ``stack.<name>(*args)`` calls ``stack._record(name, args)``.
    Install one per :data:`RECORDED_METHODS` name; ``doc`` becomes its docstring."""

    def method(self: Any, *args: Any) -> Any:
        return self._record(name, args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    return method


def output_specs(name: str, args: tuple[Any, ...]) -> list[tuple[Shape, DType]] | None:
    """The ``(shape, dtype)`` of each result of contract method ``name`` on ``args`` by the capture's shape rules
    (:data:`ember.capture.SHAPE_RULES`), without running it; None where no rule decides (the call must run now)."""
    rule = SHAPE_RULES.get(name)
    if rule is None:
        return None
    try:
        return rule(*args)
    except _NoRule:
        return None


def lower_arg(a: Any, slice_marker: Callable[[Any, Any, Any], Any], leaf: Callable[[Any], Any]) -> Any:
    """A call argument in record form: lists and plain tuples become tuples (recursively), slices become
    ``slice_marker(start, stop, step)`` (hashable; a protocol's own type with ``to_slice()``) and everything else
    goes through ``leaf`` (which turns handles into :class:`~ember.ir.Ref` and may refuse values)."""
    if type(a) is list or (isinstance(a, tuple) and not hasattr(a, "_fields")):
        return tuple(lower_arg(x, slice_marker, leaf) for x in a)
    if type(a) is slice:
        return slice_marker(a.start, a.stop, a.step)
    return leaf(a)


def ref_for(vid: int, inputs: list[int], pos: dict[int, int]) -> Ref:
    """The :class:`~ember.ir.Ref` of value ``vid`` in a record being built: ``inputs`` are the record's input ids so
    far and ``pos`` their positions; a new id is appended (each id is one input however often it is used)."""
    k = pos.get(vid)
    if k is None:
        k = pos[vid] = len(inputs)
        inputs.append(vid)
    return Ref(k)


def record_args(name: str, args: tuple[Any, ...], lower: Callable[[Any], Any]) -> tuple[Any, ...]:
    """``OpRecord.args`` of a call of ``name``: Python scalar operands (:data:`ember.capture.SCALAR_OPERANDS`)
    become :class:`~ember.ir.Scalar` (so a graph differing only in them has one relative form), the rest go
    through ``lower`` (usually :func:`lower_arg`)."""
    scalar_pos = SCALAR_OPERANDS.get(name, ())
    return tuple(Scalar(a) if i in scalar_pos and type(a) in _SCALARS else lower(a) for i, a in enumerate(args))


def graph_interface(records: Sequence[OpRecord], spec_of: Callable[[int], tuple[Shape, DType]],
                    is_live: Callable[[int], bool]) -> tuple[set[int], list[tuple[int, Shape, DType]], list[int]]:
    """What a batch of ``records`` takes and gives: ``(produced, externals, wanted)``. ``produced`` are the ids the
    records compute; ``externals`` the ids they read that were computed before, as ``(id, shape, dtype)`` in order
    of first use (``spec_of(id)`` gives shape and dtype) -- the inputs of :func:`ember.ir.relative_form`;
    ``wanted`` the produced ids still referenced (``is_live(id)``), the outputs to keep."""
    produced: set[int] = set()
    for r in records:
        produced.update(r.outputs)
    externals: list[tuple[int, Shape, DType]] = []
    seen: set[int] = set()
    for r in records:
        for v in r.inputs:
            if v not in produced and v not in seen:
                seen.add(v)
                shape, dtype = spec_of(v)
                externals.append((v, shape, dtype))
    wanted = [v for r in records for v in r.outputs if is_live(v)]
    return produced, externals, wanted


def resolve_args(a: Any, ins: Sequence[Any], scalars: Sequence[Any], error: ErrorFactory | None = None) -> Any:
    """Recorded arguments ``a`` with ``Ref(k)`` replaced by ``ins[k]``, ``Placeholder`` slots by ``scalars``,
    ``Scalar`` by its value and slice markers (any object with ``to_slice()``) by slices, nested tuples included.

    With ``error`` set, a reference or slot out of range raises ``error(message)`` instead of IndexError (for
    arguments that came from an untrusted peer)."""
    t = type(a)
    if t is Ref:
        if error is not None and not 0 <= a.k < len(ins):
            raise error(f"argument reference {a.k} out of range")
        return ins[a.k]
    if t is Placeholder:
        if error is not None and not 0 <= a.k < len(scalars):
            raise error(f"scalar placeholder {a.k} has no binding")
        return scalars[a.k]
    if t is Scalar:
        return a.value
    if t is tuple:
        return tuple(resolve_args(x, ins, scalars, error) for x in a)
    if hasattr(t, "to_slice"):  # a protocol's hashable slice marker (slices are unhashable before Python 3.12)
        return a.to_slice()
    return a


def run_graph(key: tuple[Any, ...], inputs: Sequence[Any], in_dtypes: Sequence[DType], scalars: Sequence[Any],
              method: Callable[[str], Callable[..., Any]],
              extension: Callable[[ExtensionArgs, list[Any], list[DType]], Any],
              error: ErrorFactory | None = None,
              on_record: Callable[[], None] | None = None) -> list[tuple[Any, DType]]:
    """Run graph ``key`` on ``inputs`` (handles, with dtypes ``in_dtypes``) with ``scalars`` bound to its scalar
    placeholders; returns ``(handle, dtype)`` for each output position of the key.

    ``method(name)`` gives the callable a record of ``name`` runs (usually ``getattr(stack, name)``);
    ``extension(ext_args, handles, dtypes)`` runs an ``"extension"`` record (see :func:`run_extension_record`);
    ``error`` is passed to :func:`resolve_args`; ``on_record`` is called after each record ran (counters).
    A record without dtypes is in place: its target changes and it adds no value."""
    _ext, body, outs = key
    values: list[Any] = []
    v_dtypes: list[DType] = []
    for op, positions, _shapes, dtypes, args in body:
        hs = [inputs[k] if where == "in" else values[k] for where, k in positions]
        if op == "extension":
            out = extension(args[0], hs, [in_dtypes[k] if where == "in" else v_dtypes[k] for where, k in positions])
        else:
            out = method(op)(*resolve_args(args, hs, scalars, error))
        if on_record is not None:
            on_record()
        if not dtypes:  # an in-place op: its result is its target, changed in place
            continue
        if len(dtypes) == 1 and type(out) is not tuple:
            values.append(out)
        else:
            values.extend(out)
        v_dtypes.extend(dtypes)
    return [(inputs[k], in_dtypes[k]) if where == "in" else (values[k], v_dtypes[k]) for where, k in outs]


def run_extension_record(ext: ExtensionArgs, hs: Sequence[Any], dtypes: Sequence[DType], device: Any,
                         stack: Any = None, missing: str | None = None, error: ErrorFactory | None = None) -> Any:
    """Run one extension record on ``device`` with tensor inputs ``hs`` (handles of the device's stack, dtypes
    ``dtypes``); returns the result's handle, or a tuple of handles.

    With ``stack`` given (the stack ``hs`` live on) the op's kernel for that stack runs directly where it has one
    (a router executor calls below the decorators it stands for); otherwise, and where no kernel exists, the op's
    own entry point runs on ``device`` (its kernel through dispatch, else its composition). ``missing`` is the
    message of the :class:`~ember.errors.DeviceError` an unregistered op raises."""
    from . import Tensor, dispatch, extension
    from .extension import TensorSpec

    op = extension.get(ext.name)
    if op is None:
        raise DeviceError(missing or f"the extension op {ext.name!r} is not registered in this process")
    args = resolve_args(ext.args, hs, (), error)
    kwargs = dict(ext.kwargs)
    arg_dtypes = [dtypes[r.k] if type(r) is Ref else None for r in ext.args]
    kernel = None if stack is None else dispatch.extension_kernel(op, stack)
    if kernel is None:
        targs = [Tensor._make(a, d, device) if type(r) is Ref else a for a, r, d in zip(args, ext.args, arg_dtypes)]
        out = op(*targs, **kwargs)
        return tuple(o._h for o in out) if isinstance(out, tuple) else out._h
    positions = {i: d for i, (r, d) in enumerate(zip(ext.args, arg_dtypes)) if type(r) is Ref}
    spec = op.output_spec(*[TensorSpec(tuple(a.shape), positions[i]) if i in positions else a
                            for i, a in enumerate(args)], **kwargs)
    call = extension.ExtensionCall(op, device, stack, tuple(args), kwargs, kernel, spec, positions)
    return stack.run_extension(call)
