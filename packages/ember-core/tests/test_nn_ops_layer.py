"""One primitive layer: ``ember.nn.functional`` reaches the device's stack only through ``ember.ops`` (its nn
layer, ``ember.ops.nn``), and core ops never branch on whether the stack is differentiable."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import ember
import ember.nn.functional as F
import ember.ops.nn as opsnn

SRC = Path(ember.__file__).parent
FUNCTIONAL = sorted((SRC / "nn" / "functional").glob("*.py"))
CORE_OPS = sorted((SRC / "ops").glob("*.py"))


def _attributes(path: Path) -> set[str]:
    return {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}


@pytest.mark.parametrize("path", FUNCTIONAL, ids=[p.name for p in FUNCTIONAL])
def test_functional_never_touches_the_stack(path: Path) -> None:
    assert not {"stack", "_stack"} & _attributes(path), f"{path.name} reaches the stack; call ember.ops instead"
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.lstrip(".").startswith("ops."):
            assert node.module.lstrip(".") in ("ops.nn",), f"{path.name} imports {node.module}: use ember.ops.nn"


@pytest.mark.parametrize("path", CORE_OPS, ids=[p.name for p in CORE_OPS])
def test_core_ops_do_not_branch_on_differentiable(path: Path) -> None:
    # the autodiff-specific behaviour lives in the decorator's rules for the gradient-routing contract methods
    # (select_at, select_ties, keep_graph, write_back, embedding); tracks_grad is the declared protocol probe
    tree = ast.parse(path.read_text())
    probe = [range(f.lineno, (f.end_lineno or f.lineno) + 1) for f in ast.walk(tree)
             if isinstance(f, ast.FunctionDef) and f.name == "tracks_grad"]
    lines = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "differentiable"
             and not any(n.lineno in r for r in probe)]
    assert not lines, f"{path.name} branches on stack.differentiable at lines {lines}"


def test_layer_is_not_re_exported() -> None:
    for name in ("activation", "pointwise_loss", "class_target_bounds", "host_extrema"):
        assert hasattr(opsnn, name) and not hasattr(ember, name)


def test_layer_functions_compute_what_functional_does() -> None:
    x = ember.tensor(np.linspace(-2.0, 2.0, 12).reshape(3, 4))
    w = ember.tensor(np.arange(8.0).reshape(2, 4) / 10)
    np.testing.assert_array_equal(opsnn.activation("relu", x).numpy(), F.relu(x).numpy())
    np.testing.assert_array_equal(opsnn.linear(x, w, None, (3, 2)).numpy(), F.linear(x, w).numpy())
    np.testing.assert_array_equal(opsnn.softmax(x, 1, x.dtype, log=True).numpy(), F.log_softmax(x, 1).numpy())
    assert opsnn.host_extrema(x) == (-2.0, 2.0)
    t = ember.tensor([0, 3, -100, 2])
    assert opsnn.class_target_bounds(t, -100, any_only=False) == (True, 0, 3)
    assert opsnn.class_target_bounds(ember.tensor([-100, -100]), -100, any_only=True)[0] is False
