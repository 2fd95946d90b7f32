"""ember.ir_exec: a captured graph's relative form, run with its bindings on a backend stack, equals eager
execution (including tuple-returning ops and new scalar bindings); argument resolution and its range checks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import ember
from ember.capture import CapturedGraph, ExtensionArgs, capture
from ember.errors import DeviceError
from ember.ir import Placeholder, Ref, Scalar
from ember.ir_exec import resolve_args, run_extension_record, run_graph

RNG = np.random.default_rng(21)


def _step(x: ember.Tensor, w: ember.Tensor, scale: float) -> tuple[ember.Tensor, ember.Tensor]:
    h = ((x @ w) + scale).relu() * 2.0
    vals, idx = h.topk(2, dim=1)  # a tuple-returning contract method
    return vals.sum(dim=0), idx


def _run(graph: CapturedGraph, *tensors: ember.Tensor) -> list[np.ndarray]:
    key, bindings = graph.relative_form()
    dev = tensors[0].device
    handles = [t._h for t in tensors] + [c.tensor._h for c in graph.constants]
    dtypes = [t.dtype for t in tensors] + [c.spec.dtype for c in graph.constants]
    seen: list[str] = []
    results = run_graph(key, handles, dtypes, bindings.scalars, lambda op: seen.append(op) or getattr(dev.stack, op),
                        lambda *a: pytest.fail("no extension records in this graph"))
    assert len(seen) == len(graph.records)
    assert [d for _, d in results] == [graph.dtypes[o] for o in graph.outputs]
    return [np.asarray(ember.Tensor._make(h, d, dev).numpy()) for h, d in results]


@pytest.mark.parametrize("scale", [0.5, -0.25])
def test_replaying_a_captured_graph_equals_eager(scale: float) -> None:
    x = ember.tensor(RNG.standard_normal((4, 3)).astype(np.float32))
    w = ember.tensor(RNG.standard_normal((3, 5)).astype(np.float32))
    graph = capture(_step, x, w, scale)
    got = _run(graph, x, w)
    want_vals, want_idx = _step(x, w, scale)
    np.testing.assert_allclose(got[0], want_vals.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[1], want_idx.numpy())


def test_same_key_other_scalars_follow_the_bindings() -> None:
    x = ember.tensor(RNG.standard_normal((4, 3)).astype(np.float32))
    w = ember.tensor(RNG.standard_normal((3, 5)).astype(np.float32))
    key_a, _ = capture(_step, x, w, 0.5).relative_form()
    graph_b = capture(_step, x, w, 1.5)
    assert graph_b.relative_form()[0] == key_a  # scalars are placeholders: one key, replayed with new bindings
    got = _run(graph_b, x, w)
    np.testing.assert_allclose(got[0], _step(x, w, 1.5)[0].numpy(), rtol=1e-6, atol=1e-6)


def test_resolve_args_replaces_markers() -> None:
    class Marker(tuple):
        def to_slice(self) -> slice:
            return slice(1, None, 2)

    args = (Ref(1), (Placeholder("float", 0), Scalar(3)), Marker(), "mean", None)
    assert resolve_args(args, ["a", "b"], [0.5]) == ("b", (0.5, 3), slice(1, None, 2), "mean", None)


@pytest.mark.parametrize("args, message", [((Ref(2),), "argument reference 2 out of range"),
                                           ((Placeholder("int", 1),), "scalar placeholder 1 has no binding")])
def test_resolve_args_range_checks_raise_the_callers_error(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_args(args, ["a"], [1], ValueError)
    with pytest.raises(IndexError):  # without an error factory the arguments are trusted
        resolve_args(args, ["a"], [1])


def test_unregistered_extension_raises_device_error_naming_it() -> None:
    x = ember.ones(2)
    with pytest.raises(DeviceError, match="no_such_op"):
        run_extension_record(ExtensionArgs("no_such_op", (Ref(0),), ()), [x._h], [x.dtype], x.device)


def test_tuple_results_and_recorded_methods() -> None:
    from ember.decorator import CONTRACT_METHODS
    from ember.ir_exec import NOT_RECORDED, RECORDED_METHODS, recording_method, returns_tuple

    assert returns_tuple("topk", ()) and returns_tuple("sort", ())
    assert returns_tuple("max_pool", (0, 0, 0, 0, 0, False, True))
    assert not returns_tuple("max_pool", (0, 0, 0, 0, 0, False, False))
    assert not returns_tuple("adaptive_max_pool", (0, 0))
    assert not returns_tuple("add", (0, 1))
    assert set(RECORDED_METHODS) == CONTRACT_METHODS - NOT_RECORDED and "from_numpy" not in RECORDED_METHODS

    class Recorder:
        def _record(self, name: str, args: tuple) -> tuple:
            return name, args

    m = recording_method("binary", "binary: recorded")
    assert m(Recorder(), "add", 1) == ("binary", ("add", 1)) and m.__name__ == "binary"


def test_record_args_lower_arg_and_output_specs() -> None:
    from ember.dtypes import float32
    from ember.ir_exec import lower_arg, output_specs, record_args

    x = ember.ones(2, 3)
    handles = {id(x._h): Ref(0)}

    def lower(a: object) -> object:
        return lower_arg(a, lambda *s: ("S", *s), lambda v: handles.get(id(v), v))

    # the scalar operand of binary becomes a Scalar; lists become tuples, slices markers, handles refs
    assert record_args("binary", ("add", x._h, 2.5), lower) == ("add", Ref(0), Scalar(2.5))
    assert lower([x._h, slice(0, 2, None), [1, 2]]) == (Ref(0), ("S", 0, 2, None), (1, 2))
    h = SimpleNamespace(shape=(2, 3), dtype=float32)  # a recorder's handle: shape and ember dtype, no data
    assert output_specs("reshape", (h, (3, 2))) == [((3, 2), float32)]
    assert output_specs("no_such_method", (h,)) is None


def test_graph_interface_orders_externals_and_keeps_live_outputs() -> None:
    from ember.dtypes import float32
    from ember.ir import OpRecord
    from ember.ir_exec import graph_interface

    f = float32
    records = [OpRecord("binary", (7, 3), (10,), ((2,),), (f,), ("add", Ref(0), Ref(1))),
               OpRecord("unary", (10,), (11,), ((2,),), (f,), ("neg", Ref(0))),
               OpRecord("binary", (11, 7), (12,), ((2,),), (f,), ("mul", Ref(0), Ref(1)))]
    specs = {7: ((2,), f), 3: ((1,), f)}
    produced, externals, wanted = graph_interface(records, specs.__getitem__, lambda v: v != 11)
    assert produced == {10, 11, 12}
    assert externals == [(7, (2,), f), (3, (1,), f)]
    assert wanted == [10, 12]


def test_ref_for_numbers_each_value_once() -> None:
    from ember.ir_exec import ref_for

    inputs: list[int] = []
    pos: dict[int, int] = {}
    assert [ref_for(v, inputs, pos) for v in (5, 9, 5, 2)] == [Ref(0), Ref(1), Ref(0), Ref(2)]
    assert inputs == [5, 9, 2]
