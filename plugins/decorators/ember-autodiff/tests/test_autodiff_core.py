"""Plugin-level tests of ember-autodiff: registration, device resolution, options, balanced checkpointing.

The gradient rules themselves are checked by the conformance kit (``ember.testing.test_autograd``), which every
backend runs; these tests cover what only the plugin knows: how it plugs into ember and what checkpointing keeps.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
import weakref
from typing import Any

import numpy as np
import pytest

import ember
from ember import AutodiffError, Device, ValueRangeError
from ember.nn import functional as F
from ember_autodiff import CONTRACT
from ember_autodiff.backend import AutodiffBackend
from ember_autodiff.graph import ADArray

FLEX = Device.flex()
AD = FLEX.autodiff()
BAL = FLEX.autodiff(checkpointing="balanced")


# ------------------------------------------------------------------------------------------------------------
# registration and resolution
# ------------------------------------------------------------------------------------------------------------
def test_decorator_is_registered() -> None:
    from ember.plugins import registry

    registry.ensure_loaded()
    spec = registry.decorator("autodiff")
    assert spec is not None and spec.contract == CONTRACT
    info = ember.info()
    names = {d["name"]: d for d in info["decorators"]}
    assert "autodiff" in names and names["autodiff"]["contract"] == CONTRACT
    assert "reverse-mode" in names["autodiff"]["description"]
    assert not [e for e in info["errors"] if "autodiff" in str(e)]


def test_ember_info_cli_lists_the_decorator() -> None:
    res = subprocess.run([sys.executable, "-m", "ember.cli", "info"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    section = res.stdout.split("decorators (", 1)[1].split("\n\n", 1)[0]
    assert "autodiff" in section and "reverse-mode differentiation" in section


def test_autodiff_device_wraps_the_shared_flex_backend() -> None:
    assert AD is Device.flex().autodiff()  # interned
    assert Device.parse("flex+autodiff") is AD
    assert str(AD) == "flex+autodiff" and AD.inner is FLEX and AD.base is FLEX
    stack = AD.stack
    assert isinstance(stack, AutodiffBackend) and stack.differentiable
    assert stack.inner is FLEX.stack  # one backend object: one memory pool, one random stream
    assert BAL is not AD and BAL.stack is not stack and BAL.stack.inner is FLEX.stack
    assert not stack.balanced and BAL.stack.balanced
    assert "balanced" in BAL.stack.describe() and stack.name == f"{FLEX.stack.name}+autodiff"
    assert stack.supported_dtypes == FLEX.stack.supported_dtypes
    assert FLEX.autodiff(checkpointing="none").stack.balanced is False


def test_autodiff_wraps_any_backend() -> None:
    """The decorator knows no particular backend: the required-primitives-only example backend works too."""
    try:
        toy = Device("toy")._checked()
    except Exception:  # noqa: BLE001 - the example backend is a test-only distribution
        pytest.skip("the example 'toy' backend is not installed")
    grads = []
    for dev in (AD, toy.autodiff()):
        x = ember.tensor(np.linspace(-1, 1, 6).reshape(2, 3), device=dev, requires_grad=True)
        y = (F.softmax(x * 2, dim=1) * ember.tensor([1.0, 2.0, 3.0], device=dev)).sum() + x.pow(2).mean()
        y.backward()
        assert isinstance(dev.stack, AutodiffBackend) and x.grad.device is dev
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6)


def test_seed_reaches_the_shared_stream() -> None:
    AD.seed(11)
    a = ember.rand(5, device=AD).numpy()
    FLEX.seed(11)
    b = ember.rand(5, device=FLEX).numpy()
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------------------
# options
# ------------------------------------------------------------------------------------------------------------
def test_bogus_checkpointing_fails_when_first_used() -> None:
    dev = FLEX.autodiff(checkpointing="bogus")  # devices are lazy: nothing resolved yet
    assert dev.decorators == (("autodiff", (("checkpointing", "bogus"),)),) and str(dev).startswith("flex+autodiff")
    with pytest.raises(ValueRangeError, match="checkpointing") as info:
        ember.ones(2, device=dev)
    assert "'bogus'" in str(info.value) and "balanced" in str(info.value)
    with pytest.raises(ValueRangeError):
        dev.stack  # noqa: B018 - still failing on the next use, not half-resolved
    assert FLEX.stack is not None and AD.stack is not None  # the shared inner backend is unharmed


# ------------------------------------------------------------------------------------------------------------
# balanced checkpointing
# ------------------------------------------------------------------------------------------------------------
def _chain(x: Any, n: int, keep: list[Any] | None = None) -> Any:
    """A long chain of memory-bound ops (elementwise and a view) ending in a scalar."""
    y = x
    for i in range(n):
        y = (y * 1.01 + 0.1 * i).sin()
        if keep is not None:
            keep.append(weakref.ref(y._h.value))
    return y.reshape(-1).sum()


def _leaf(dev: Device, n: int = 1000, seed: int = 0) -> Any:
    return ember.tensor(np.random.default_rng(seed).standard_normal(n), device=dev, requires_grad=True)


def test_balanced_frees_memory_bound_intermediates() -> None:
    alive = {}
    for dev in (AD, BAL):
        refs: list[Any] = []
        x = _leaf(dev)
        loss = _chain(x, 12, refs)
        gc.collect()
        alive[dev] = sum(r() is not None for r in refs[:-1])  # the last one feeds the kept output
        loss.backward()
    assert alive[AD] == 11, "without checkpointing every intermediate is saved for backward"
    assert alive[BAL] == 0, f"balanced checkpointing kept {alive[BAL]} intermediate arrays alive"


def test_balanced_keeps_compute_bound_outputs() -> None:
    for dev in (AD, BAL):
        a = _leaf(dev, 12).reshape(3, 4)
        w = ember.tensor(np.ones((4, 5)), device=dev, requires_grad=True)
        h = a @ w
        ref = weakref.ref(h._h.value)
        s = h.tanh()
        e = s.exp()
        sref = weakref.ref(s._h.value)
        del h, s
        gc.collect()
        assert ref() is not None, f"{dev}: matmul output must be kept (recomputing it costs a matmul)"
        assert (sref() is None) == (dev is BAL), f"{dev}: tanh output kept={sref() is not None}"
        e.sum().backward()


def _held_bytes(dev: Device, n: int, steps: int) -> tuple[int, np.ndarray]:
    x = _leaf(dev, n)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        loss = _chain(x, steps)
        dev.sync()  # a fused device records the chain lazily: compute it (and store what the graph keeps)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    loss.backward()
    return held, x.grad.numpy()


def test_balanced_memory_and_identical_gradients() -> None:
    n, steps = 100_000, 16  # 0.8 MB per float64 array
    plain, g_plain = _held_bytes(AD, n, steps)
    bal, g_bal = _held_bytes(BAL, n, steps)
    assert plain > steps * n * 8, f"without checkpointing the graph holds {plain} bytes"
    assert bal < plain / 4, f"balanced holds {bal} bytes after forward, none holds {plain}"
    np.testing.assert_array_equal(g_bal, g_plain)


def _mlp(dev: Device) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    x = ember.tensor(rng.standard_normal((8, 6)), device=dev)
    params = [ember.tensor(rng.standard_normal(s) * 0.5, device=dev, requires_grad=True)
              for s in [(10, 6), (10,), (10,), (10,), (4, 10)]]
    w1, b1, g1, be1, w2 = params
    h = F.layer_norm(F.gelu(F.linear(x, w1, b1)), (10,), g1, be1)
    logits = F.linear(F.silu(h)[:, ::2].repeat(1, 2), w2[:, :10])
    loss = F.cross_entropy(logits, ember.tensor([0, 1, 2, 3, 0, 1, 2, 3], device=dev)) + logits.var()
    loss.backward()
    return [p.grad.numpy() for p in params]


def test_balanced_gradients_identical_on_a_network() -> None:
    for a, b in zip(_mlp(AD), _mlp(BAL)):
        np.testing.assert_array_equal(b, a)


def test_balanced_recompute_still_checks_inplace() -> None:
    x = _leaf(BAL, 4)
    y = x * 2
    z = y.sin()  # saves y (recomputable)
    y.add_(1.0)
    with pytest.raises(AutodiffError, match="in-place"):
        z.sum().backward()


# ------------------------------------------------------------------------------------------------------------
# handles and graph bookkeeping
# ------------------------------------------------------------------------------------------------------------
def test_untracked_ops_record_nothing() -> None:
    x = ember.ones(3, device=AD)
    y = (x * 2).exp()
    assert isinstance(y._h, ADArray) and y._h.meta is None and y.grad_fn is None


def test_graph_is_freed_after_backward() -> None:
    x = _leaf(AD, 8)
    y = x.exp() * 3
    node = y.grad_fn
    assert node is not None and node.vjp is not None and node() == "mulBackward"
    y.sum().backward()
    assert node.vjp is None  # saved values released (retain_graph=False)


def test_grad_on_untracked_outputs_says_why() -> None:
    x = ember.ones(3, device=AD)
    with pytest.raises(AutodiffError, match="does not require grad"):
        x.sum().backward()
    with pytest.raises(AutodiffError, match="retain_grad"):
        x.retain_grad()

