"""The op registry (ember.opinfo) is the one source of the elementwise ops' names: the contract lists, the public
functions and aliases, the Tensor methods and operators, and the dtype rules all agree with it."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import backend, opinfo
from ember.ops import elementwise, pointwise
from ember.tensor import Tensor


def test_contract_lists_are_the_registry_lists() -> None:
    assert backend.UNARY_OPS == opinfo.UNARY_OPS
    assert backend.BINARY_OPS == opinfo.BINARY_OPS
    assert backend.COMPARISON_OPS == opinfo.COMPARISON_OPS
    assert backend.PREDICATE_UNARY_OPS == opinfo.PREDICATE_UNARY_OPS
    assert opinfo.COMPARISON_OPS <= opinfo.BINARY_OPS and opinfo.PREDICATE_UNARY_OPS <= opinfo.UNARY_OPS


def test_every_contract_op_has_one_primitive_entry() -> None:
    names = [op.name for op in opinfo.OPS]
    assert len(names) == len(set(names)), "duplicate OpInfo names"
    for op in backend.UNARY_OPS:
        assert opinfo.get(op).kind == "primitive" and opinfo.get(op).arity == 1, op
    for op in backend.BINARY_OPS:
        assert opinfo.get(op).kind == "primitive" and opinfo.get(op).arity == 2, op
    with pytest.raises(KeyError, match="no OpInfo entry named 'nope'"):
        opinfo.get("nope")


def test_dtype_rules_are_the_ones_the_front_door_applies() -> None:
    assert elementwise._FLOAT_UNARY == opinfo.FLOAT_UNARY_OPS
    assert elementwise._PRED_UNARY == opinfo.PREDICATE_UNARY_OPS
    assert elementwise._FLOAT_RESULT == opinfo.FLOAT_BINARY_OPS
    assert elementwise._BOOL_RESULT == opinfo.COMPARISON_OPS
    assert elementwise._INT_ONLY == opinfo.INTEGRAL_BINARY_OPS


@pytest.mark.parametrize("info", opinfo.OPS, ids=lambda op: op.name)
def test_functions_and_methods_exist(info: opinfo.OpInfo) -> None:
    for fn in info.functions:
        assert callable(getattr(ember, fn, None)), f"ember.{fn} missing"
        assert getattr(ember, fn) is getattr(ember, info.name), f"ember.{fn} is not an alias of ember.{info.name}"
        assert fn in pointwise.__all__
    for m in info.methods:
        assert callable(getattr(Tensor, m, None)), f"Tensor.{m} missing"
        assert getattr(Tensor, m) is pointwise.TENSOR_METHODS[m]
    assert set(info.functions) - {info.name} == set(info.aliases)


@pytest.mark.parametrize("info", [op for op in opinfo.OPS if op.arity == 1 and op.kind == "primitive"],
                         ids=lambda op: op.name)
def test_unary_rule_matches_the_result_dtype(info: opinfo.OpInfo) -> None:
    """The dtype rule of each unary primitive, as the front door applies it to int32 and float64 inputs."""
    i, f = ember.tensor([1, 2], dtype=ember.int32), ember.tensor([0.25, 0.5], dtype=ember.float64)
    if info.dtypes == "integral":
        with pytest.raises(ember.DTypeError, match=info.name):
            getattr(ember, info.name)(f)
    else:
        assert getattr(ember, info.name)(f).dtype is (ember.bool_ if info.dtypes == "bool" else ember.float64)
    want = {"float": ember.get_default_dtype(), "bool": ember.bool_}.get(info.dtypes, ember.int32)
    assert getattr(ember, info.name)(i).dtype is want


@pytest.mark.parametrize("dunder", sorted(opinfo.OPERATORS))
def test_operators_map_to_their_op(dunder: str) -> None:
    """Each registry operator computes its op (reflected ones with the operands swapped, in-place ones in place)."""
    op = opinfo.OPERATORS[dunder]
    info = opinfo.get(op)
    assert dunder in info.operators
    if info.arity == 1:
        x = ember.tensor([3, -5, 6], dtype=ember.int32)
        want = getattr(ember, op)(x)
        assert getattr(x, dunder)().tolist() == want.tolist()
        return
    a = ember.tensor([7, 12, 5], dtype=ember.int64)
    b = ember.tensor([2, 3, 1], dtype=ember.int64)
    role = info.operators.index(dunder)  # 0 forward, 1 reflected, 2 in-place
    if role == 1:
        got, want = getattr(b, dunder)(a), getattr(ember, op)(a, b)
    elif role == 2:
        if info.dtypes == "float":  # int64 /= int64 would have to cast a float result back
            a, b = a.to(ember.float32), b.to(ember.float32)
        want = getattr(ember, op)(a, b)
        target = a.clone()
        got = getattr(target, dunder)(b)
        assert got is target, f"{dunder} must update its target in place"
    else:
        got, want = getattr(a, dunder)(b), getattr(ember, op)(a, b)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert got.dtype is want.dtype


def test_every_binary_operator_triple_is_forward_reflected_inplace() -> None:
    for info in opinfo.select(arity=2):
        if len(info.operators) == 3:
            fwd, rev, inp = info.operators
            assert rev == "__r" + fwd[2:] and inp == "__i" + fwd[2:], info.name


def test_entries_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown dtype rule"):
        opinfo.OpInfo("x", 1, "primitive", "weird", ("x",), ("x",))
    with pytest.raises(ValueError, match="unknown domain"):
        opinfo.OpInfo("x", 1, "primitive", "same", ("x",), ("x",), domain="nowhere")
    assert opinfo.get("asin").torch == "asin" and opinfo.get("asin").inplace
    assert not opinfo.get("isnan").inplace and not opinfo.get("isnan").differentiable


def test_docs_op_tables_list_every_entry() -> None:
    """docs/_ext/ember_ops.py (the docs' op tables) renders one row per registry entry."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "docs" / "_ext" / "ember_ops.py"
    if not path.exists():
        pytest.skip("not a repository checkout")
    spec = importlib.util.spec_from_file_location("ember_ops", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.render_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [*opinfo.DTYPE_RULES, *(op.name for op in opinfo.OPS)]
    assert "**" not in text.replace("\\*\\*", ""), "an unescaped ** would turn into emphasis"
