"""ember.ir.relative_form: the plan-cache key abstracts ids, dims and scalar values, and nothing else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember import Device, ir
from ember import dtypes as dt
from ember.ir import Instr, Kernel, OpRecord, Placeholder, Ref, Scalar, interpret, relative_form

F32, F64 = dt.float32, dt.float64


def _records(a: int = 3, b: int = 4, scale: float = 2.0, ids: tuple[int, int, int, int] = (10, 11, 12, 13),
             dtype: Any = F32, op: str = "mul", reduce_dim: int = 1) -> tuple[Any, Any]:
    x, y, z, r = ids
    recs = [
        OpRecord("binary", (x,), (y,), ((a, b),), (dtype,), (op, Ref(0), Scalar(scale))),
        OpRecord("unary", (y,), (z,), ((a, b),), (dtype,), ("exp", Ref(0))),
        OpRecord("reduce", (z,), (r,), ((a,) if reduce_dim == 1 else (b,),), (dtype,),
                 ("sum", Ref(0), (reduce_dim,), False)),
    ]
    return relative_form(recs, [(x, (a, b), dtype)], [r])


def test_key_ignores_ids_dims_and_scalar_values() -> None:
    key, bind = _records()
    assert _records(ids=(1, 2, 3, 4))[0] == key
    assert _records(a=7, b=9)[0] == key
    assert _records(scale=-0.5)[0] == key
    assert hash(key) == hash(_records(a=5, b=6, scale=3.0, ids=(5, 6, 7, 8))[0])
    assert bind.dims == (3, 4) and bind.scalars == (2.0,)
    assert _records(a=7, b=9, scale=0.25)[1].dims == (7, 9)
    assert _records(scale=0.25)[1].scalars == (0.25,)


@pytest.mark.parametrize("change", [
    {"op": "add"}, {"dtype": F64}, {"reduce_dim": 0}, {"a": 4, "b": 4}, {"a": 1}, {"b": 0}, {"scale": 2},
    {"scale": True},
])
def test_key_keeps_structure_dtype_dim_equality_and_literal_dims(change: dict[str, Any]) -> None:
    assert _records(**change)[0] != _records()[0]


def test_zero_and_one_dims_stay_literal() -> None:
    key, bind = relative_form([OpRecord("unary", (0,), (1,), ((1, 0, 5),), (F32,), ("neg", Ref(0)))],
                              [(0, (1, 0, 5), F32)], [1])
    (ext,), body, _ = key
    assert ext[0][:2] == (1, 0) and isinstance(ext[0][2], Placeholder)
    assert body[0][2] == ((1, 0, Placeholder("dim", 0)),)
    assert bind.dims == (5,)


def test_equal_dims_share_a_slot() -> None:
    key, bind = relative_form([OpRecord("binary", (0, 1), (2,), ((3, 3),), (F32,), ("add", Ref(0), Ref(1)))],
                              [(0, (3, 3), F32), (1, (3,), F32)], [2])
    assert bind.dims == (3,)
    key2, bind2 = relative_form([OpRecord("binary", (0, 1), (2,), ((6, 6),), (F32,), ("add", Ref(0), Ref(1)))],
                                [(0, (6, 6), F32), (1, (6,), F32)], [2])
    assert key2 == key and bind2.dims == (6,)


def test_outputs_and_unlisted_inputs_are_part_of_the_key() -> None:
    recs = [OpRecord("unary", (0,), (1,), ((4,),), (F32,), ("neg", Ref(0))),
            OpRecord("unary", (1,), (2,), ((4,),), (F32,), ("exp", Ref(0)))]
    k_last = relative_form(recs, [(0, (4,), F32)], [2])[0]
    k_both = relative_form(recs, [(0, (4,), F32)], [1, 2])[0]
    assert k_last != k_both
    k_unlisted = relative_form(recs, [], [2])[0]  # an input numbered on first use, without shape or dtype
    assert k_unlisted != k_last and k_unlisted == relative_form(recs, [], [2])[0]


def test_interpret_is_the_reference_semantics() -> None:
    FlexBackend = type(Device.flex().stack.base_backend)  # through the device: no plugin import

    be = FlexBackend()
    body = (Instr("load", (0,), F32), Instr("load", (1,), F32), Instr("scalar", (0,), F32),
            Instr("binary", ("mul", 0, 2), F32), Instr("binary", ("add", 3, 1), F32),
            Instr("binary", ("gt", 4, 2), dt.bool_), Instr("where", (5, 4, 2), F32))
    k = Kernel(2, (F32, F32), 1, body, (6,), ("max", (1,)))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, -1, 0], np.float32)
    (out,) = interpret(k, be, [x, b], [2.0], (2, 3))
    v = x * 2 + b
    np.testing.assert_array_equal(out, np.where(v > 2, v, 2).max(1, keepdims=True))
    k2 = Kernel(2, (F32,), 0, (Instr("load", (0,), F32),), (0,))
    (copy,) = interpret(k2, be, [b], [], (2, 3))
    assert copy.shape == (2, 3) and not np.shares_memory(copy, b)  # outputs are new memory


def _spying_flex() -> tuple[Any, list[str]]:
    """Unfused flex that records the ops it runs in place."""
    from ember import Device

    flex = Device.flex().fusion(False).stack
    calls: list[str] = []

    class Spy(type(flex)):  # type: ignore[misc]
        def inplace_binary(self, op, a, b):  # noqa: ANN001, ANN202
            calls.append(op)
            return super().inplace_binary(op, a, b)

    return Spy(), calls


def test_interpret_writes_an_in_place_target_with_the_backends_in_place_op() -> None:
    be, calls = _spying_flex()
    f = dt.float32
    # out = a + b * 2 with out = a: the add runs in place; a kernel that also reads a elsewhere must not
    body = (ir.Instr("load", (0,), f), ir.Instr("load", (1,), f), ir.Instr("scalar", (0,), f),
            ir.Instr("binary", ("mul", 1, 2), f), ir.Instr("binary", ("add", 0, 3), f))
    k = ir.Kernel(1, (f, f), 1, body, (4,))
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    (r,) = ir.interpret(k, be, [a, b], [2.0], (4,), [a])
    assert r is a and calls == ["add"]
    np.testing.assert_array_equal(a, [2, 3, 4, 5])
    reads_a_twice = ir.Kernel(1, (f, f), 1, (*body[:4], ir.Instr("binary", ("add", 0, 3), f),
                                             ir.Instr("binary", ("mul", 4, 0), f)), (5,))
    calls.clear()
    (r,) = ir.interpret(reads_a_twice, be, [a, b], [2.0], (4,), [a])
    # a is read twice, so the result is computed in dead temporaries (in place there) and then copied into a
    assert r is a and calls == ["add", "mul"]
    np.testing.assert_array_equal(a, [8, 15, 24, 35])
    np.testing.assert_array_equal(b, [1, 1, 1, 1])  # inputs are never written


def test_interpret_reuses_dead_temporaries_but_never_inputs_outputs_or_live_values() -> None:
    from ember import Device

    be = Device.flex().fusion(False).stack
    f = dt.float32
    # t = x * 2 (temporary); u = t + 1 (t dead: in place); out0 = u, out1 = exp(x) + u (u is an output: no reuse)
    body = (ir.Instr("load", (0,), f), ir.Instr("scalar", (0,), f), ir.Instr("binary", ("mul", 0, 1), f),
            ir.Instr("scalar", (1,), f), ir.Instr("binary", ("add", 2, 3), f), ir.Instr("unary", ("exp", 0), f),
            ir.Instr("binary", ("add", 5, 4), f))
    k = ir.Kernel(1, (f,), 2, body, (4, 6))
    x = np.arange(3, dtype=np.float32)
    u, w = ir.interpret(k, be, [x], [2.0, 1.0], (3,))
    np.testing.assert_array_equal(x, [0, 1, 2])
    np.testing.assert_array_equal(u, [1, 3, 5])
    np.testing.assert_allclose(w, np.exp([0, 1, 2]) + [1, 3, 5], rtol=1e-6)
    assert u is not w and not np.shares_memory(u, w)
    # a broadcast operand never grows a temporary in place: (3,) temp + (2, 3) input gives a new (2, 3) array
    k2 = ir.Kernel(2, (f, f), 1, (ir.Instr("load", (0,), f), ir.Instr("scalar", (0,), f),
                                  ir.Instr("binary", ("mul", 0, 1), f), ir.Instr("load", (1,), f),
                                  ir.Instr("binary", ("add", 2, 3), f)), (4,))
    (r,) = ir.interpret(k2, be, [x, np.ones((2, 3), np.float32)], [3.0], (2, 3))
    np.testing.assert_array_equal(r, [[1, 4, 7], [1, 4, 7]])


def test_interpret_writes_in_place_when_earlier_instructions_read_the_target() -> None:
    be, calls = _spying_flex()
    f = dt.float32
    # lerp: a <- a + (g - a) * w; a is read by the sub before the add writes it
    body = (ir.Instr("load", (0,), f), ir.Instr("load", (1,), f), ir.Instr("binary", ("sub", 1, 0), f),
            ir.Instr("scalar", (0,), f), ir.Instr("binary", ("mul", 2, 3), f), ir.Instr("binary", ("add", 0, 4), f))
    k = ir.Kernel(1, (f, f), 1, body, (5,))
    a, g = np.zeros(4, np.float32), np.arange(4, dtype=np.float32)
    (r,) = ir.interpret(k, be, [a, g], [0.5], (4,), [a])
    assert r is a and calls == ["mul", "add"]  # the mul reuses the dead (g - a) temporary, the add writes a
    np.testing.assert_array_equal(a, [0, 0.5, 1, 1.5])
    np.testing.assert_array_equal(g, [0, 1, 2, 3])
