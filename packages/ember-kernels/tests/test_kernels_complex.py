"""ember_kernels.complex_: the complex expressions of the map template (OpenCL's float2/double2), the conversions to
and from complex, the fp64 pragma for complex128, and that complex values never reach the fused generator or the
CUDA catalog's real-dtype programs."""

from __future__ import annotations

import pytest

from ember import dtypes as dt
from ember.ir import Instr, Kernel
from ember_kernels import complex_ as cx
from ember_kernels import fusion
from ember_kernels.ctypes_ import FP64_PRAGMA, ctype, header
from ember_kernels.elementwise import Family, _map_source


def test_complex_ctypes_are_opencl_vectors() -> None:
    assert ctype(dt.complex64).storage == "float2" and ctype(dt.complex128).compute == "double2"
    assert FP64_PRAGMA in header(ctype(dt.complex128)) and FP64_PRAGMA not in header(ctype(dt.complex64))


def test_expressions_use_helpers_and_refuse_ordering_ops() -> None:
    t = ctype(dt.complex64)
    assert cx.binary_expr("mul", "a", "b", t) == ("ember_cmul_float(a, b)", {"cmath"})
    assert cx.binary_expr("add", "a", "b", t) == ("(a + b)", set())
    assert cx.unary_expr("exp", "x", ctype(dt.complex128))[0] == "ember_cexp_double(x)"
    for op in ("lt", "maximum", "remainder", "bitwise_and"):
        with pytest.raises(KeyError):
            cx.binary_expr(op, "a", "b", t)
    with pytest.raises(KeyError):
        cx.unary_expr("floor", "x", t)


def test_conversions() -> None:
    assert cx.convert_expr("v0", dt.float32, dt.complex64) == "((float2)((float)(v0), (float)0))"
    assert cx.convert_expr("v0", dt.complex64, dt.float64) == "v0.x"
    assert cx.convert_expr("v0", dt.complex128, dt.bool_) == "(v0.x != 0 || v0.y != 0)"
    assert cx.convert_expr("v0", dt.complex64, dt.complex128) == "convert_double2(v0)"
    assert cx.convert_expr("v0", dt.complex64, dt.complex64) == "v0"


def test_map_source_emits_the_helpers_only_when_used() -> None:
    t = ctype(dt.complex128)
    mul = _map_source(Family([(cx.binary_expr("mul", "v0", "v1", t)[0], frozenset({"cmath"}), dt.complex128)]),
                      ((t, True), (t, True)), 1, "linear")
    assert "ember_cmul_double" in mul and mul.startswith(FP64_PRAGMA)
    add = _map_source(Family([("(v0 + v1)", frozenset(), dt.complex128)]), ((t, True), (t, True)), 1, "linear")
    assert "ember_cmul" not in add


def test_complex_never_fuses() -> None:
    k = Kernel(rank=1, inputs=(dt.complex64,), scalars=0,
               body=(Instr("load", (0,), dt.complex64), Instr("unary", ("neg", 0), dt.complex64)), outputs=(1,))
    with pytest.raises(fusion._Unsupported):
        fusion._Body(k, fp64=True)
