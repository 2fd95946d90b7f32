"""Every benchmark row times work, not lazy recording (issue 17).

On a fused device (OpenCL GPUs by default; flex and CPU drivers when fusion is named) ops are recorded lazily and
only what a live tensor can still read is computed; a timed call that drops its result times the recording alone
(the 8-op GELU chain once read 0.066 ms against torch's 2.6 ms). Every row of
benchmarks/{micro,overhead,autodiff,suite,opencl}.py is timed through ``_common.sample_cases``; here that function
is replaced by a probe that runs each ember case once, through the very loop the timing uses (``_common.time_loop``,
one call), and reads the devices' fusion counters around it. A case fails when it ran no kernel at all, or when it
recorded ops lazily and realized none of them.

No timing is asserted; sizes are the smallest that still record lazily (>= 2**19 elements for elementwise rows).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device
from ember.errors import EmberError

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
if not (BENCH / "_common.py").is_file():
    pytest.skip("benchmarks/ is not in this checkout", allow_module_level=True)
if str(BENCH) not in sys.path:  # the scripts import their siblings by name, as `ember bench` runs them
    sys.path.insert(0, str(BENCH))

import _common  # noqa: E402

#: counters of ember-fusion's memory report that count work run on the backend under it, and the backend calls
#: an ember.compile'd case made (replays run the base backend's kernels directly, beneath any fusion decorator)
WORK = ("fusion_eager", "fusion_single_ops", "fusion_kernels_run", "fusion_boundaries", "compiled_kernels")
#: a lazily recorded op (not run at once) is fusion_recorded - fusion_eager
COUNTERS = ("fusion_recorded", "fusion_realizations", *WORK)


def _compiled_kernels(fn: Any, before: dict[str, Any] | None) -> int:
    """Backend calls the ember.compile'd function behind a case (its ``compiled`` attribute) made since
    ``before`` (its stats then): every replay runs ``kernels`` calls, a recording or eager call runs the function
    eagerly (``records`` calls; at least one: a first, warm-up recording keeps no graph to count them in)."""
    compiled = getattr(fn, "compiled", None)
    if compiled is None or before is None:
        return 0
    now = compiled.stats()
    ran = (now["recordings"] - before["recordings"]) + (now["eager_calls"] - before["eager_calls"])
    return (now["replays"] - before["replays"]) * now["kernels"] + ran * max(now["records"], 1)


@functools.cache
def _opencl() -> Device | None:
    """Device.opencl(0), or None without an OpenCL device (looked up once)."""
    try:
        dev = Device.opencl(0)
        dev.stack  # noqa: B018 - creates the runtime; raises where there is no OpenCL device
        return dev
    except EmberError:
        return None


def _devices() -> list[Device]:
    """The fused stacks the benchmarks run on (flex+autodiff shares flex's fusion stack, so its counters; every
    backend is fused in this module, see _devices_record_lazily)."""
    return [d for d in (Device.flex(), _opencl()) if d is not None]


def _counts() -> dict[str, int]:
    total = dict.fromkeys(COUNTERS, 0)
    for dev in _devices():
        report = dev.memory_report()
        for k in COUNTERS:
            total[k] += int(report.get(k, 0))
    return total


def _problem(delta: dict[str, int]) -> str | None:
    """Why a case's counter deltas show no realized work, or None when they do."""
    ran = sum(delta[k] for k in WORK)
    lazy = delta["fusion_recorded"] - delta["fusion_eager"]
    if ran == 0:
        return f"ran no kernel (counters {delta})"
    if lazy > 0 and delta["fusion_realizations"] == 0:
        return f"recorded {lazy} op(s) lazily and realized none (counters {delta})"
    return None


def _reset_stacks() -> None:
    """Every interned device resolves its stack again on next use (after flex's fusion preference changed)."""
    from ember import device as device_mod
    from ember import dispatch

    dispatch._backend_cache.clear()
    for dev in device_mod._interned.values():
        dev._stack = None


@pytest.fixture(autouse=True, scope="module")
def _devices_record_lazily() -> Iterator[None]:
    """Backends may decline automatic fusion (flex does; OpenCL on a CPU does), so their rows would run eagerly
    here and could not drop a lazy result. For this module only, fusion wraps every backend that supports it
    without being named: each row is checked on devices that record lazily, on any machine."""
    import dataclasses

    from ember.plugins.manager import registry

    spec = registry.decorator("fusion")
    if spec is None or not spec.on_by_default():
        pytest.skip("fusion is off (EMBER_FUSION=0 or ember-fusion not installed): nothing records lazily")
    registry.decorators["fusion"] = dataclasses.replace(spec, applies_to=None)
    _reset_stacks()
    try:
        yield
    finally:
        registry.decorators["fusion"] = spec
        _reset_stacks()


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, int]]]]:
    """Replace the benchmarks' sampling with one realized call per ember case; yields (case, counter delta) pairs."""
    seen: list[tuple[str, dict[str, int]]] = []
    # the module the scripts will import now (another test may have re-imported the benchmark modules)
    common = importlib.import_module("_common")

    def sample_cases(cases: dict[str, Callable[[], Any]], repeats: int, number: int = 1, warmup: int = 1,
                     realize_results: bool = True, hold: int = 1) -> dict[str, list[float]]:
        for name, fn in cases.items():
            if name.startswith("ember"):  # torch and numpy compute eagerly; they are not what this checks
                compiled = getattr(fn, "compiled", None)
                stats = compiled.stats() if compiled is not None else None
                before = _counts()
                common.time_loop(fn, 1, realize_results, hold)
                after = _counts()
                delta = {k: after[k] - before[k] for k in COUNTERS}
                delta["compiled_kernels"] = _compiled_kernels(fn, stats)
                seen.append((name, delta))
        return {name: [1e-3] for name in cases}  # a stand-in time: the rows' ratios stay computable

    monkeypatch.setattr(common, "sample_cases", sample_cases)
    yield seen


#: (id, script, row function, arguments): every timed row of the scripts, at the smallest sizes that still record
#: lazily (elementwise rows need >= 2**19 elements); the scripts are imported only when a row runs
ROWS: list[tuple[str, str, str, tuple[Any, ...]]] = [
    ("micro-per-op", "micro", "bench_per_op", (1, 1)),
    ("micro-matmul", "micro", "bench_matmul", ((64,), 1)),
    ("micro-conv2d", "micro", "bench_conv", (2, 1)),
    ("micro-elementwise-and-reductions", "micro", "bench_elementwise_and_reductions", (1 << 20, 1)),
    ("micro-copy", "micro", "bench_copy", (4, 1)),
    # extension ops (nn.gelu, nn.layer_norm and their backward), computed at the call: forward on flex,
    # forward+backward on flex+autodiff
    ("micro-gelu-layer-norm", "micro", "bench_gelu_layer_norm", (2, 1)),
    ("micro-train-kernels", "micro", "bench_train_kernels", (8, 2, 1, 1)),
    ("overhead-add", "overhead", "bench_add", (1, 1)),
    ("autodiff-per-op", "autodiff", "bench_per_op", (1, 1)),
    ("autodiff-train-step", "autodiff", "bench_train_step", (2, 1, 0)),
    ("suite-cnn-train", "suite", "bench_train", ("cnn", 2, 1, 0)),
    ("suite-transformer-train", "suite", "bench_train", ("transformer-small", 1, 1, 0)),
    ("suite-cnn-inference", "suite", "bench_inference", ("cnn", 2, 1, 0)),
    ("suite-transformer-inference", "suite", "bench_inference", ("transformer-small", 1, 1, 0)),
    # a product small enough for the untuned kernel: a cold PoCL compile stays ~10 s. opencl.bench_cnn is not run
    # here (its cold kernel compiles take minutes on PoCL): it times suite.ember_train_step, checked above on flex,
    # whose step reads its loss and syncs its device
    ("opencl-matmul", "opencl", "bench_matmul", ([(16, 128, 64, "small")], 1)),
]


@pytest.mark.parametrize(("script", "function", "args"), [pytest.param(*r[1:], id=r[0]) for r in ROWS])
def test_every_ember_case_of_the_row_realizes_its_work(script: str, function: str, args: tuple[Any, ...],
                                                      probe: list[tuple[str, dict[str, int]]]) -> None:
    if script == "opencl" and _opencl() is None:
        pytest.skip("no OpenCL device")
    figures = getattr(importlib.import_module(script), function)(*args)
    assert figures, "the row reported nothing"
    assert probe, "the row timed no ember case"
    problems = [f"{name}: {why}" for name, delta in probe if (why := _problem(delta)) is not None]
    assert not problems, "\n".join(problems)


def _gelu_chain() -> Callable[[], Any]:
    import micro

    x = ember.tensor(np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32), device=Device.flex())
    return lambda: micro._gelu_chain(x, ember.tanh)


def test_the_probe_catches_a_row_that_drops_its_lazy_result() -> None:
    """The counters tell recording from computing: the GELU chain with its result dropped (the old timing loop)
    records 8 ops and runs nothing; realized, it runs them."""
    chain = _gelu_chain()
    chain()  # warm-up: the plan is built and cached
    before = _counts()
    _common.time_loop(chain, 1, realize_results=False)
    dropped = {k: v - before[k] for k, v in _counts().items()}
    assert dropped["fusion_recorded"] - dropped["fusion_eager"] >= 8
    assert _problem(dropped) is not None
    before = _counts()
    _common.time_loop(chain, 1)
    kept = {k: v - before[k] for k, v in _counts().items()}
    assert _problem(kept) is None and kept["fusion_kernels_run"] >= 1


def test_realize_computes_pending_results_in_nested_containers() -> None:
    chain = _gelu_chain()
    y = chain()
    before = _counts()
    _common.realize({"out": [(y, 1.0)]}, np.zeros(3), None)
    assert _counts()["fusion_realizations"] > before["fusion_realizations"]
    before = _counts()
    _common.realize(y)  # already computed: nothing left to run
    assert _counts()["fusion_realizations"] == before["fusion_realizations"]
    assert y.shape == (1 << 20,) and np.isfinite(y.numpy()).all()


def test_time_loop_realizes_every_held_result() -> None:
    """hold > 1 keeps results alive and syncs once per hold: every result is still computed."""
    chain = _gelu_chain()
    chain()
    before = _counts()
    _common.time_loop(chain, 5, hold=2)  # chunks of 2, 2 and a remainder of 1
    delta = {k: v - before[k] for k, v in _counts().items()}
    assert _problem(delta) is None
    assert delta["fusion_realizations"] == 3  # one plan per sync: the two held chains of a chunk run together
