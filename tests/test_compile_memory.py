"""ember.compile's memory is no worse than eager's: the recording calls and the replays of a training step peak no
higher than the eager step, the graph holds nothing the eager step does not, and ``reset()`` frees it.

Measured with tracemalloc (numpy reports its array buffers to it), not RSS: deterministic for a given code path,
independent of the allocator's caching and of what else runs on the machine. No timing."""

from __future__ import annotations

import gc
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import ember
from ember import nn
from ember.nn import functional as F

STEPS = 5  # a warm-up (Adam creates its state), a recording, three replays
BATCH, WIDTH, DEPTH = 256, 192, 4  # activations (BATCH x WIDTH float32, 192 KiB each) dominate the parameters
#: what the compiled step may hold or peak above eager: the graph's Python objects (records, kernel arguments),
#: small against the ~2 MiB of activations one step keeps for its backward pass
SLACK = 256 * 1024


def _device() -> ember.Device:
    try:
        dev = ember.Device.parse("flex+autodiff")
        dev.stack  # noqa: B018 - resolving the stack finds out whether the backend is usable here
        return dev
    except ember.errors.EmberError as e:
        pytest.skip(f"flex+autodiff is not available here: {e}")


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(x)


@contextmanager
def _traced() -> Iterator[None]:
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    try:
        yield
    finally:
        if not was:
            tracemalloc.stop()


def _setup(dev: ember.Device, compiled: bool, zero_grad_first: bool) -> tuple[Callable[[], Any], Any, Any]:
    """A training step of the MLP (Adam) on fixed data; returns (call, the compiled function or None, the model)."""
    ember.manual_seed(0)
    model = _MLP().to(dev)
    opt = ember.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(3)
    x = ember.tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32), device=dev)
    y = ember.tensor(rng.integers(0, 10, BATCH), device=dev)

    def step(x: Any, y: Any) -> Any:
        if zero_grad_first:
            opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if not zero_grad_first:
            opt.zero_grad()
        return loss

    fn = ember.compile(step) if compiled else step

    def call() -> float:
        return float(fn(x, y).item())

    return call, (fn if compiled else None), model


def _measure(call: Callable[[], Any]) -> tuple[list[int], int]:
    """(peak traced bytes of each of STEPS calls above the memory held before the first, memory held after them),
    with garbage collected before each call (so no earlier call's garbage counts) and during none."""
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    peaks = []
    for _ in range(STEPS):
        gc.collect()
        gc.disable()  # collections at allocation-count thresholds would move the peaks between runs
        try:
            tracemalloc.reset_peak()
            call()
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            gc.enable()
    gc.collect()
    return peaks, tracemalloc.get_traced_memory()[0] - base


@pytest.mark.parametrize("zero_grad_first", [True, False], ids=["zero_grad_first", "zero_grad_last"])
def test_compiled_step_peaks_and_holds_no_more_than_eager(zero_grad_first: bool) -> None:
    dev = _device()
    with _traced():
        eager_call, _, _ = _setup(dev, False, zero_grad_first)
        eager_peaks, eager_held = _measure(eager_call)
        del eager_call
        # a first compiled function, unmeasured: the process's one-time costs of a first replay (the fused kernels'
        # numexpr programs, interpreter tables that grow with every module the test run imported) belong to no step
        warm_call, _, _ = _setup(dev, True, zero_grad_first)
        for _ in range(STEPS):
            warm_call()
        del warm_call
        gc.collect()
        call, fn, _ = _setup(dev, True, zero_grad_first)
        peaks, held = _measure(call)
        stats = fn.stats()
        assert stats["replays"] == STEPS - stats["recordings"] >= 2 and stats["graph_breaks"] == 0, stats
        eager_peak = max(eager_peaks)
        # every call, the recording ones included (they run eagerly while recording), peaks no higher than eager
        for k, p in enumerate(peaks):
            assert p <= eager_peak + SLACK, (
                f"compiled call {k} peaks {p / 2**20:.2f} MiB above its start, eager {eager_peak / 2**20:.2f} MiB "
                f"(eager per call: {[round(e / 2**20, 2) for e in eager_peaks]})")
        # steady state: model, gradients and Adam state as eager, plus the graph (records, not tensors)
        assert held <= eager_held + SLACK, (held, eager_held)
        graph = next(iter(fn._graphs.values()))
        gone = weakref.ref(graph)
        del graph
        fn.reset()
        gc.collect()
        assert gone() is None, "reset() left the graph alive"
        peaks_again, _ = _measure(call)  # recorded again from scratch after reset: still no higher than eager
        assert max(peaks_again) <= eager_peak + SLACK, (peaks_again, eager_peak)


def test_recording_frees_intermediates_as_eager_does() -> None:
    """The recording call itself: its trace holds the step's intermediate values weakly, so a forward pass whose
    intermediates die as it goes (no_grad inference) peaks where eager does, not at the sum of its activations."""
    dev = _device()
    with _traced():
        ember.manual_seed(0)
        model = _MLP().to(dev)
        x = ember.tensor(np.random.default_rng(1).standard_normal((BATCH, WIDTH)).astype(np.float32), device=dev)

        def infer(x: Any) -> Any:
            with ember.no_grad():
                return model(x)

        fn = ember.compile(infer)
        eager_peaks, _ = _measure(lambda: infer(x).numpy())
        peaks, _ = _measure(lambda: fn(x).numpy())
        assert fn.stats()["replays"] >= 1, fn.stats()
        # (a recording that held every value peaked at 2.5x eager here)
        assert max(peaks) <= max(eager_peaks) + SLACK, (peaks, eager_peaks)
