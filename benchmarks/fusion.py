"""Fusion benchmark: fused devices (the default, ember-fusion) against ``dev.fusion(False)`` (the same device,
unfused), on flex and on OpenCL (``Device.opencl(0)``, when present), with PyTorch CPU in the same run.

1. **gelu**: the GELU tanh chain ``0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x*x*x)))`` (9 elementwise
   ops: micro.py's 8-op chain and the final ``0.5 *``) on 1M float32. Each call keeps its result and ends with
   ``dev.sync()``, so the lazily recorded work is counted. Reports ms medians with spread and the fused speedup
   (unfused time / fused time; targets: >= 3x on OpenCL, >= 2x on flex), and whether the fused kernel was compiled
   by the backend's code generator or interpreted (``Backend.fusion_compile`` returned None).
2. **train**: seed-CNN training step (Adam; batch 64, and 256 unless ``--quick``) and the small seed transformer's
   (AdamW), fused vs unfused on ``flex+autodiff`` (and ``opencl+autodiff``), same weights, batch and dropout seed
   (suite.py's models and batches). Also the fusion plan cache: hits, misses and kernels run over steps 2..N (the
   ``memory_report()`` counters differenced after step 1, so the first step's plan building is excluded). Fused
   and unfused are compared on the losses of those N steps (each carries the earlier steps' updates); the largest
   parameter difference after them is reported but not judged (a conv bias ahead of BatchNorm has a zero gradient
   up to rounding, which Adam turns into a full lr-sized step).
3. **overhead**: per-op recording cost on tiny tensors (1,000 float32). Backend level: ``stack.binary("add", h,
   h2)`` on handles, results dropped (nothing is executed), one flush per batch of ops; a 32-op add/mul chain kept
   and flushed (recording plus one fused kernel); Tensor level: ``a + b`` per op (results kept and synced every 64
   calls) and ``(a + b).numpy()`` (run and read back). Fused vs unfused (and torch for the Tensor-level
   figures); target <= 5 us per op.

Every section first runs fused and unfused from the same inputs and records the maximum relative difference of
their outputs (``max_rel_diff``: max |fused - unfused| / max |unfused|); a difference above the section's tolerance
is reported and makes the exit status 1, as does a case that raised (its error is in ``errors``, the other figures
still run). Every timed figure is the median over >= 5 alternating repeats after warm-up, with min/max/IQR as
spread; the cases of one workload (fused and unfused on every backend, torch) alternate inside every repeat.

Two sections run only when named with ``--sections`` (they are slow, and for tuning the decorator):

4. **threshold**: the eager threshold (``dev.fusion(eager_below=N)``): elementwise chains (2 to 9 ops, with and
   without transcendentals) on 2**12 .. 2**21 float32 elements, three cases alternating: the default fused device,
   the fused device that records every op (``eager_below=0``: recording, plan lookup, fused kernels) and the unfused
   device. Where "record every op" is slower than unfused, planning cannot pay and ops should run eagerly.
5. **lstm**: a 2-layer LSTM written in ember ops (per time step ``x @ W_ih.T + h @ W_hh.T + b``, ``chunk``,
   sigmoid/tanh gates, ``c``/``h`` updates; 35 steps, batch 20, hidden 200), forward, backward and an SGD update,
   fused vs unfused on ``flex+autodiff``: the small-op model fusion must not slow down.

Usage::

    ember bench fusion [--quick] [--json PATH] [--sections SECTION ...]
    python benchmarks/fusion.py [--quick] [--json PATH] [--sections SECTION ...]

``--quick`` (CI smoke, well under a minute) shrinks loop counts, uses small transformer batches and runs the
training section on flex only (OpenCL's cold kernel compiles of a whole training step take tens of seconds).
Sections: gelu, train, overhead.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench fusion` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

from _common import bench_parser, describe_environment, environment, write_json  # noqa: E402
from micro import NUMPY, TORCH, figure, format_table, measure, torch_module  # noqa: E402
from opencl import opencl_device  # noqa: E402
from suite import ember_train_step, torch_train_step  # noqa: E402

import ember  # noqa: E402
from ember import Device  # noqa: E402

SECTIONS = ("gelu", "train", "overhead")
EXTRA_SECTIONS = ("threshold", "lstm")  # run only when named with --sections
BACKENDS = ("flex", "opencl")
GELU_TARGET = {"flex": 2.0, "opencl": 3.0}  # fused speedup (unfused time / fused time)
RECORD_TARGET_US = 5.0  # per recorded op
N_TINY = 1000  # elements of the overhead section's tensors
CHAIN_OPS = 32  # ops of the overhead section's kept-and-flushed chain
RECORD_BATCH = 200  # recorded ops per flush (below the fusion decorator's default bound of 256 pending ops)
# fused vs unfused: relative difference above which the outputs are said to disagree
# (train: of the per-step losses, which also carry every earlier step's update)
TOLERANCE = {"gelu": 1e-4, "train": 1e-4, "overhead": 1e-5, "threshold": 0.0, "lstm": 0.0}


# ----------------------------------------------------------------------------------------------------------
# devices and helpers
# ----------------------------------------------------------------------------------------------------------
def case(backend: str, fused: bool, autodiff: bool = False) -> str:
    """The name of a timed case, e.g. ``ember opencl+autodiff fused``."""
    return f"ember {backend}{'+autodiff' if autodiff else ''} {'fused' if fused else 'unfused'}"


def devices(backend: str, autodiff: bool = False) -> tuple[Device, Device]:
    """(fused, unfused) flavours of one backend's device 0: ``fusion()`` named (flex declines automatic fusion,
    OpenCL fuses by default) and ``fusion(False)``."""
    base = Device.flex() if backend == "flex" else Device.opencl(0)
    fused, unfused = base.fusion(), base.fusion(False)
    return (fused.autodiff(), unfused.autodiff()) if autodiff else (fused, unfused)


def counters(dev: Device) -> dict[str, float]:
    """The fusion decorator's counters (``fusion_*`` keys of ``memory_report()``); empty on an unfused stack."""
    return {k: v for k, v in dev.memory_report().items() if k.startswith("fusion_")}


def delta(after: dict[str, float], before: dict[str, float], key: str) -> int:
    return int(after.get(key, 0) - before.get(key, 0))


def codegen(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Distinct kernels the backend compiled (``fusion_compile`` returned a function) or left to the interpreter
    (it returned None) between two counter snapshots."""
    return {"compiled": delta(after, before, "fusion_kernels_compiled"),
            "interpreted": delta(after, before, "fusion_kernels_interpreted")}


def rel_diff(a: Any, b: Any) -> float:
    """max |a - b| / max |b| in float64 (0 when both are empty)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


def fused_extras(s: dict[str, dict[str, float]], fused: str, unfused: str, section: str, diff: float,
                 active: bool) -> dict[str, Any]:
    """The fields every figure of this benchmark carries besides micro.figure's."""
    return {"fused_case": fused, "unfused_case": unfused, "fusion_active": active,
            "speedup_fused": s[unfused]["median"] / s[fused]["median"],
            "max_rel_diff": diff, "tolerance": TOLERANCE[section], "agree": bool(diff <= TOLERANCE[section])}


def scaled(s: dict[str, dict[str, float]], k: int) -> dict[str, dict[str, float]]:
    """Statistics of a batch of k ops turned into per-op figures."""
    return {name: {key: v / k for key, v in st.items()} for name, st in s.items()}


# ----------------------------------------------------------------------------------------------------------
# 1. GELU chain
# ----------------------------------------------------------------------------------------------------------
def gelu(x: Any, tanh: Callable[[Any], Any]) -> Any:
    """The GELU tanh form, as written (9 elementwise ops on a Tensor)."""
    return 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def bench_gelu(n: int, backends: Sequence[str], repeats: int, number: int) -> list[dict[str, Any]]:
    """ms per GELU chain on n float32: fused and unfused per backend, torch and numpy, all alternating."""
    x_np = np.random.default_rng(3).standard_normal(n, dtype=np.float32)
    x64 = x_np.astype(np.float64)
    ref = gelu(x64, np.tanh)
    cases: dict[str, Callable[[], Any]] = {}
    info: dict[str, dict[str, Any]] = {}
    for backend in backends:
        fused_dev, unfused_dev = devices(backend)
        outs = {}
        for is_fused, dev in ((True, fused_dev), (False, unfused_dev)):
            x = ember.tensor(x_np, device=dev)

            def call(x: Any = x, dev: Device = dev) -> Any:
                y = gelu(x, ember.tanh)
                dev.sync()  # y is still alive here: the pending chain really runs inside the timed call
                return y

            before = counters(dev)
            outs[is_fused] = call().numpy()
            after = counters(dev)
            call()  # a second call replays the cached plan: the steady-state kernel count
            steady = counters(dev)
            cases[case(backend, is_fused)] = call
            if is_fused:
                info[backend] = {"fusion_active": "fusion_recorded" in after, "codegen": codegen(before, after),
                                 "kernels_per_call": delta(steady, after, "fusion_kernels_run")}
        info[backend]["diff"] = rel_diff(outs[True], outs[False])
        info[backend]["rel_err_vs_numpy"] = {"fused": rel_diff(outs[True], ref), "unfused": rel_diff(outs[False], ref)}
    cases[NUMPY] = lambda: gelu(x_np, np.tanh)
    torch = torch_module()
    if torch is not None:
        tx = torch.from_numpy(x_np.copy())
        cases[TORCH] = lambda: gelu(tx, torch.tanh)
    s = measure(cases, repeats, number)
    out = []
    for backend in backends:
        fc, uc = case(backend, True), case(backend, False)
        mine = {k: v for k, v in s.items() if k in (fc, uc, TORCH) or (backend == "flex" and k == NUMPY)}
        i = info[backend]
        cg = i["codegen"]
        gen = "compiled" if cg["compiled"] else ("interpreted" if cg["interpreted"] else "cached")
        extras = fused_extras(s, fc, uc, "gelu", i["diff"], i["fusion_active"])
        target = GELU_TARGET[backend]
        out.append(figure("gelu", f"GELU tanh chain (9 ops), {n / 1e6:g}M f32, {backend}", "ms", mine, ember_case=fc,
                          backend=backend, **extras, target_speedup=target,
                          target_met=bool(extras["speedup_fused"] >= target), codegen=cg,
                          kernels_per_call=i["kernels_per_call"], rel_err_vs_numpy=i["rel_err_vs_numpy"],
                          note=f"fused kernel {gen}, {i['kernels_per_call']} kernel(s)/call; "
                               f"fused vs unfused rel. diff {i['diff']:.1e}"))
    return out


# ----------------------------------------------------------------------------------------------------------
# 4. eager threshold (opt-in)
# ----------------------------------------------------------------------------------------------------------
THRESHOLD_CHAINS: dict[str, Callable[[Any, Any], Any]] = {
    "(x + y) * 0.5 (2 ops)": lambda x, y: (x + y) * 0.5,
    "((x*0.9 + y*0.1) * x - y) / 3 (6 ops)": lambda x, y: ((x * 0.9 + y * 0.1) * x - y) / 3.0,
    "GELU tanh chain (9 ops)": lambda x, y: gelu(x, ember.tanh),
    "LSTM-cell-like gates (sigmoid, tanh; 5 ops)": lambda x, y: x.sigmoid() * y + x.tanh() * y.sigmoid(),
}
THRESHOLD_SIZES = tuple(1 << k for k in range(12, 22))
EAGER = "ember flex fused (default eager_below)"
RECORD_ALL = "ember flex fused (eager_below=0)"


def bench_threshold(sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """us per chain (result read with numpy()) on the default fused device, the fused device recording every op,
    and the unfused device, alternating; speedup_fused is unfused / record-every-op."""
    base = Device.flex().fusion()
    devs = {EAGER: base, RECORD_ALL: base.fusion(eager_below=0), case("flex", False): base.fusion(False)}
    out = []
    for n in sizes:
        rng = np.random.default_rng(n)
        xn, yn = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        number = max(1, 2**18 // n)
        for name, chain in THRESHOLD_CHAINS.items():
            cases: dict[str, Callable[[], Any]] = {}
            results = {}
            for label, dev in devs.items():
                x, y = ember.tensor(xn, device=dev), ember.tensor(yn, device=dev)

                def call(x: Any = x, y: Any = y, chain: Callable[[Any, Any], Any] = chain) -> Any:
                    return chain(x, y).numpy()

                results[label] = call()
                cases[label] = call
            s = measure(cases, repeats, number, warmup=2)
            diff = max(rel_diff(results[EAGER], results[case("flex", False)]),
                       rel_diff(results[RECORD_ALL], results[case("flex", False)]))
            extras = fused_extras(s, RECORD_ALL, case("flex", False), "threshold", diff, True)
            out.append(figure("threshold", f"{name}, {n} f32", "us", s, ember_case=EAGER, backend="flex", n=n,
                              chain=name, **extras,
                              speedup_default=s[case("flex", False)]["median"] / s[EAGER]["median"]))
    return out


# ----------------------------------------------------------------------------------------------------------
# 5. LSTM written in ember ops (opt-in)
# ----------------------------------------------------------------------------------------------------------
def lstm_step(dev: Device, steps: int = 35, batch: int = 20, hidden: int = 200, layers: int = 2
              ) -> Callable[[], float]:
    """One step of a ``layers``-layer LSTM over ``steps`` time steps in ember ops: forward, backward, SGD update
    (seeded weights: every device starts from the same values)."""
    rng = np.random.default_rng(0)

    def param(*shape: int) -> Any:
        return ember.tensor((rng.standard_normal(shape) * 0.05).astype(np.float32), device=dev, requires_grad=True)

    weights = [(param(4 * hidden, hidden), param(4 * hidden, hidden), param(4 * hidden)) for _ in range(layers)]
    xs = ember.tensor(rng.standard_normal((steps, batch, hidden)).astype(np.float32), device=dev)
    flat = [p for ws in weights for p in ws]

    def step() -> float:
        inputs = [xs[t] for t in range(steps)]
        for w_ih, w_hh, b in weights:
            h, c = ember.zeros(batch, hidden, device=dev), ember.zeros(batch, hidden, device=dev)
            outs = []
            for t in range(steps):
                i, f, g, o = (inputs[t] @ w_ih.T + h @ w_hh.T + b).chunk(4, 1)
                c = f.sigmoid() * c + i.sigmoid() * g.tanh()
                h = o.sigmoid() * c.tanh()
                outs.append(h)
            inputs = outs
        loss = ember.stack(inputs).pow(2).mean()
        loss.backward()
        with ember.no_grad():
            for p in flat:
                p.sub_(p.grad * 0.1)
                p.grad = None
        return float(loss.item())

    return step


def bench_lstm(repeats: int, steps: int) -> list[dict[str, Any]]:
    """ms per LSTM step, fused vs unfused flex+autodiff (and torch's same loop), alternating."""
    fused, unfused = devices("flex", autodiff=True)
    fc, uc = case("flex", True, True), case("flex", False, True)
    cases: dict[str, Callable[[], Any]] = {fc: lstm_step(fused), uc: lstm_step(unfused)}
    losses = {k: [fn() for _ in range(steps)] for k, fn in cases.items()}  # also the warm-up
    diff = rel_diff(losses[fc], losses[uc])
    s = measure(cases, repeats, 1, warmup=0)
    return [figure("lstm", "2-layer LSTM in ember ops (35 steps, batch 20, hidden 200): forward+backward+SGD", "ms",
                   s, ember_case=fc, backend="flex", **fused_extras(s, fc, uc, "lstm", diff, True))]


# ----------------------------------------------------------------------------------------------------------
# 2. training steps
# ----------------------------------------------------------------------------------------------------------
def train_step(model: str, dev: Device, batch: int) -> tuple[Callable[[], float], Any]:
    """(one training step of suite.py's ``model`` on ``dev`` -- an autodiff device --, the model)."""
    step = ember_train_step(model, batch, dev)
    return step, step.model  # type: ignore[attr-defined]


def _state(m: Any) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def _check_steps(step: Callable[[], float], dev: Device, steps: int) -> tuple[list[float], dict[str, Any]]:
    """Run ``steps`` steps from a seeded random stream (dropout masks match across fused and unfused: the stream
    is shared by every decoration of a device); returns the losses and the plan-cache figures of steps 2..N."""
    dev.seed(0)
    c0 = counters(dev)
    losses = [step()]
    c1 = counters(dev)
    losses += [step() for _ in range(steps - 1)]
    c2 = counters(dev)
    hits, misses = delta(c2, c1, "fusion_plan_hits"), delta(c2, c1, "fusion_plan_misses")
    cache = {"steps": steps, "measured_steps": steps - 1, "hits": hits, "misses": misses,
             "hit_rate": hits / (hits + misses) if hits + misses else None,
             "kernels_run_per_step": delta(c2, c1, "fusion_kernels_run") / (steps - 1),
             "realizations_per_step": delta(c2, c1, "fusion_realizations") / (steps - 1),
             # ops below the device's eager_below run at once, unrecorded: a small model may plan nothing at all
             "eager_per_step": delta(c2, c1, "fusion_eager") / (steps - 1),
             "first_step": {"hits": delta(c1, c0, "fusion_plan_hits"), "misses": delta(c1, c0, "fusion_plan_misses"),
                            "kernels_run": delta(c1, c0, "fusion_kernels_run")},
             "codegen": codegen(c0, c2)}
    return losses, cache


def bench_train(model: str, batch: int, backends: Sequence[str], repeats: int, steps: int) -> list[dict[str, Any]]:
    """ms per training step, fused vs unfused per backend (and torch), alternating; plan-cache hit rates."""
    cases: dict[str, Callable[[], Any]] = {}
    info: dict[str, dict[str, Any]] = {}
    for backend in backends:
        fused_dev, unfused_dev = devices(backend, autodiff=True)
        runs = {}
        for is_fused, dev in ((True, fused_dev), (False, unfused_dev)):
            step, m = train_step(model, dev, batch)
            losses, cache = _check_steps(step, dev, steps)  # also the warm-up: kernels compiled, plans cached
            runs[is_fused] = (losses, _state(m), cache, "fusion_recorded" in counters(dev))
            cases[case(backend, is_fused, autodiff=True)] = step
        (lf, sf, cache, active), (lu, su, _, _) = runs[True], runs[False]
        # parameters are reported, not judged: a conv bias ahead of BatchNorm has a zero gradient up to rounding,
        # which Adam turns into a full lr-sized step whose sign depends on the order of the rounding
        param_diffs = {k: rel_diff(sf[k], su[k]) for k in su}
        worst = max(param_diffs, key=param_diffs.__getitem__)
        info[backend] = {"cache": cache, "active": active, "losses": {"fused": lf, "unfused": lu},
                         "loss_diff": rel_diff(lf, lu), "param_diff": param_diffs[worst], "worst_param": worst}
    if torch_module() is not None:
        cases[TORCH] = torch_train_step(model, batch)
        cases[TORCH]()  # its warm-up; the ember cases were warmed by their check steps
    s = measure(cases, repeats, 1, warmup=0)
    opt = "Adam" if model == "cnn" else "AdamW"
    out = []
    for backend in backends:
        fc, uc = case(backend, True, True), case(backend, False, True)
        mine = {k: v for k, v in s.items() if k in (fc, uc, TORCH)}
        i = info[backend]
        diff = i["loss_diff"]
        c = i["cache"]
        rate = "n/a" if c["hit_rate"] is None else f"{100 * c['hit_rate']:.1f}%"
        out.append(figure("train", f"{model} train step, batch {batch} ({opt}), {backend}+autodiff", "ms", mine,
                          ember_case=fc, backend=backend, model=model, batch=batch,
                          **fused_extras(s, fc, uc, "train", diff, i["active"]),
                          max_rel_diff_params=i["param_diff"], worst_param=i["worst_param"], losses=i["losses"],
                          plan_cache=c, note=f"plan hits {rate} over steps 2..{c['steps']}, "
                                             f"{c['kernels_run_per_step']:.0f} kernels/step; loss diff {diff:.1e}"))
    return out


# ----------------------------------------------------------------------------------------------------------
# 3. recording overhead
# ----------------------------------------------------------------------------------------------------------
def _chain(stack: Any, h: Any, h2: Any) -> Any:
    """CHAIN_OPS alternating ``+ h2`` and ``* 0.5`` on backend handles, then a sync (a flush when fused)."""
    for i in range(CHAIN_OPS):
        h = stack.binary("add", h, h2) if i % 2 == 0 else stack.binary("mul", h, 0.5)
    stack.sync()
    return h


def bench_overhead(repeats: int, number: int) -> list[dict[str, Any]]:
    """us per op on 1,000 float32: backend-level recording, a flushed chain, Tensor-level ``a + b``."""
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal(N_TINY, dtype=np.float32), rng.standard_normal(N_TINY, dtype=np.float32)
    fused_dev, unfused_dev = devices("flex")
    fc, uc = case("flex", True), case("flex", False)
    active = "fusion_recorded" in counters(fused_dev)
    fs, us = fused_dev.stack, unfused_dev.stack
    fh, fh2 = fs.from_numpy(a_np), fs.from_numpy(b_np)
    uh, uh2 = us.from_numpy(a_np), us.from_numpy(b_np)
    out = []

    # backend level, recorded only: the results die at once, so the flush that ends each batch runs nothing
    def record(stack: Any, h: Any, h2: Any) -> None:
        binary = stack.binary
        for _ in range(RECORD_BATCH):
            binary("add", h, h2)
        stack.sync()

    kept = fs.binary("add", fh, fh2)
    diff = rel_diff(fs.to_numpy(kept), us.to_numpy(us.binary("add", uh, uh2)))
    del kept
    s = scaled(measure({fc: lambda: record(fs, fh, fh2), uc: lambda: record(us, uh, uh2)}, repeats,
                       max(1, number // RECORD_BATCH)), RECORD_BATCH)
    out.append(_overhead_figure(f"stack.binary('add', h, h2) on handles, {N_TINY} f32, results dropped "
                                f"(recorded only; {RECORD_BATCH} ops per flush)", s, fc, uc, diff, active,
                                target=True, level="backend"))

    # backend level, recorded and run: a kept chain, flushed as one fused kernel
    diff = rel_diff(fs.to_numpy(_chain(fs, fh, fh2)), us.to_numpy(_chain(us, uh, uh2)))
    s = scaled(measure({fc: lambda: _chain(fs, fh, fh2), uc: lambda: _chain(us, uh, uh2)}, repeats,
                       max(1, number // CHAIN_OPS)), CHAIN_OPS)
    out.append(_overhead_figure(f"{CHAIN_OPS}-op add/mul chain on handles, {N_TINY} f32, kept and flushed "
                                "(per op)", s, fc, uc, diff, active, target=False, level="backend"))

    # Tensor level: a + b per op, and (a + b).numpy() (run and read back)
    fa, fb = ember.tensor(a_np, device=fused_dev), ember.tensor(b_np, device=fused_dev)
    ua, ub = ember.tensor(a_np, device=unfused_dev), ember.tensor(b_np, device=unfused_dev)
    diff = rel_diff((fa + fb).numpy(), (ua + ub).numpy())
    torch = torch_module()
    ta, tb = (torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy())) if torch is not None else (None, None)
    cases: dict[str, Callable[[], Any]] = {fc: lambda: fa + fb, uc: lambda: ua + ub}
    if torch is not None:
        cases[TORCH] = lambda: ta + tb
    # every result is computed: kept alive and synced every 64 calls, so the sync's fixed cost is not charged to
    # each op (at this size the fused device runs the op at once, below its eager_below)
    out.append(_overhead_figure(f"Tensor a + b, {N_TINY} f32 (per op; results synced every 64 ops)",
                                measure(cases, repeats, number, hold=64), fc, uc, diff, active, target=True,
                                level="tensor"))
    cases = {fc: lambda: (fa + fb).numpy(), uc: lambda: (ua + ub).numpy()}
    if torch is not None:
        cases[TORCH] = lambda: (ta + tb).numpy()
    out.append(_overhead_figure(f"Tensor (a + b).numpy(), {N_TINY} f32 (recorded and run)",
                                measure(cases, repeats, max(1, number // 4)), fc, uc, diff, active, target=False,
                                level="tensor"))
    return out


def _overhead_figure(name: str, s: dict[str, dict[str, float]], fc: str, uc: str, diff: float, active: bool,
                     target: bool, level: str) -> dict[str, Any]:
    extra: dict[str, Any] = {"level": level, "us_per_op": {k: v["median"] * 1e6 for k, v in s.items()}}
    if target:  # the recording target applies where nothing runs: the fused case's time is all recording
        extra["target_us_per_op"] = RECORD_TARGET_US
        extra["target_met"] = bool(s[fc]["median"] * 1e6 <= RECORD_TARGET_US)
    return figure("overhead", name, "us", s, ember_case=fc, **fused_extras(s, fc, uc, "overhead", diff, active),
                  **extra, note=f"fused vs unfused rel. diff {diff:.1e}")


# ----------------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------------
def _met(fig: dict[str, Any]) -> str:
    return "met" if fig["target_met"] else "NOT met"


def format_extra(figures: list[dict[str, Any]]) -> str:
    """Per figure: fused and unfused medians, the fused speedup against its target, plan cache, agreement."""
    lines = []
    for fig in figures:
        s, fc, uc = fig["seconds"], fig["fused_case"], fig["unfused_case"]
        scale = 1e6 if fig["unit"] == "us" else 1e3
        head = (f"  [{fig['section']}] {fig['name']}: fused {s[fc]['median'] * scale:.4g} {fig['unit']}, unfused "
                f"{s[uc]['median'] * scale:.4g} {fig['unit']}, fused speedup {fig['speedup_fused']:.2f}x")
        if fig["section"] == "gelu":
            head += f" (target >= {fig['target_speedup']:.0f}x: {_met(fig)})"
        if "target_us_per_op" in fig:
            head += f"; recording target <= {fig['target_us_per_op']:.0f} us/op: {_met(fig)}"
        if fig["section"] == "threshold":
            head = (f"  [threshold] {fig['name']}: record every op {s[fc]['median'] * scale:.4g} us, unfused "
                    f"{s[uc]['median'] * scale:.4g} us ({fig['speedup_fused']:.2f}x), default "
                    f"{s[fig['ember_case']]['median'] * scale:.4g} us ({fig['speedup_default']:.2f}x)")
        if not fig["fusion_active"]:
            head += "; fusion NOT active on this device (fused == unfused)"
        if fig["section"] == "train":
            c = fig["plan_cache"]
            rate = "n/a" if c["hit_rate"] is None else f"{100 * c['hit_rate']:.1f}%"
            head += (f"\n      plan cache over steps 2..{c['steps']}: {c['hits']} hits, {c['misses']} misses ({rate}); "
                     f"{c['kernels_run_per_step']:.0f} fused kernels and {c['realizations_per_step']:.0f} "
                     f"realizations and {c['eager_per_step']:.0f} ops run at once per step; first step "
                     f"{c['first_step']['misses']} misses; kernels compiled "
                     f"{c['codegen']['compiled']}, interpreted {c['codegen']['interpreted']}")
        agree = "agree" if fig["agree"] else "DISAGREE"
        what = "losses of every step" if fig["section"] == "train" else "outputs"
        head += (f"\n      fused vs unfused {what}: max rel. diff {fig['max_rel_diff']:.2e} ({agree}, tol "
                 f"{fig['tolerance']:g})")
        if fig["section"] == "train":
            head += f"; parameters after them: {fig['max_rel_diff_params']:.1e} ({fig['worst_param']})"
        lines.append(head)
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------
def plan(quick: bool) -> dict[str, Any]:
    """Sizes and repeat counts (>= 5 timed repeats everywhere)."""
    if quick:
        return {"gelu": (10**6, 5, 2), "train": [("cnn", 8), ("transformer-small", 2)], "train_steps": 2,
                "train_opencl": False, "repeats": 5, "overhead": (5, 2000)}
    return {"gelu": (10**6, 9, 5), "train": [("cnn", 64), ("cnn", 256), ("transformer-small", 8)], "train_steps": 5,
            "train_opencl": True, "repeats": 7, "overhead": (9, 20000)}


def _guarded(result: dict[str, Any], section: str, what: str, fn: Callable[[], list[dict[str, Any]]]) -> None:
    """Run one workload; a failure is recorded (and printed) and the other workloads still run."""
    try:
        result["figures"] += fn()
    except Exception as exc:  # a code generator under construction must not cost every other figure
        traceback.print_exc()
        result["errors"].append({"section": section, "workload": what, "error": f"{type(exc).__name__}: {exc}"})


def run(quick: bool, sections: Sequence[str], backends: Sequence[str]) -> dict[str, Any]:
    p = plan(quick)
    result: dict[str, Any] = {"figures": [], "errors": [], "section_seconds": {}, "train_backends": None}
    for section in sections:
        t0 = time.perf_counter()
        if section == "gelu":
            n, repeats, number = p["gelu"]
            _guarded(result, section, "gelu", lambda n=n, r=repeats, k=number: bench_gelu(n, backends, r, k))
        elif section == "train":
            result["train_backends"] = [b for b in backends if b == "flex" or p["train_opencl"]]
            for model, batch in p["train"]:
                _guarded(result, section, f"{model} batch {batch}",
                         lambda m=model, b=batch, tb=result["train_backends"]: bench_train(m, b, tb, p["repeats"],
                                                                                             p["train_steps"]))
        elif section == "overhead":
            _guarded(result, section, "overhead", lambda: bench_overhead(*p["overhead"]))
        elif section == "threshold":
            sizes = THRESHOLD_SIZES[::3] if quick else THRESHOLD_SIZES
            _guarded(result, section, "threshold", lambda sz=sizes: bench_threshold(sz, p["repeats"]))
        elif section == "lstm":
            _guarded(result, section, "lstm", lambda: bench_lstm(max(15, p["repeats"]), 3))
        result["section_seconds"][section] = time.perf_counter() - t0
        print(f"[{section}: {result['section_seconds'][section]:.1f} s]", file=sys.stderr, flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("ember fusion: fused vs unfused devices (GELU chain, training steps, recording overhead) "
                          "on flex and OpenCL, with PyTorch", "small loops and batches, flex-only training (CI smoke)",
                          SECTIONS + EXTRA_SECTIONS)
    args = parser.parse_args(argv)

    env = environment()
    sections = [s for s in SECTIONS + EXTRA_SECTIONS if s in (args.sections or SECTIONS)]
    ocl, desc = opencl_device()
    if ocl is not None:  # the fused device's stack (a CPU driver fuses only when fusion is named)
        desc = ocl.fusion().stack.describe()
    backends = [b for b in BACKENDS if b == "flex" or ocl is not None]
    print(describe_environment(env))
    print(f"flex: {Device.flex().fusion().stack.describe()}")
    print(f"opencl: {desc}" if ocl is not None else f"opencl: skipped, no OpenCL device ({desc})")
    print("times: median of >= 5 alternating repeats after warm-up; spread = min..max and IQR; the 'ember' column "
          "is the fused case; fused speedup = unfused time / fused time (> 1: fusion is faster)\n")
    result: dict[str, Any] = {"benchmark": "fusion", "quick": args.quick, "sections": sections, "backends": backends,
                              "opencl": {"available": ocl is not None, "device" if ocl is not None else "reason": desc},
                              **run(args.quick, sections, backends)}
    if result["figures"]:
        print(format_table(result["figures"]))
        print("\n" + format_extra(result["figures"]))
    if result["train_backends"] is not None and "opencl" in backends and "opencl" not in result["train_backends"]:
        print("\nnote: --quick runs the train section on flex only (cold OpenCL compiles of a training step take "
              "tens of seconds)")
    bad = [f["name"] for f in result["figures"] if not f["agree"]]
    for name in bad:
        print(f"\nfusion bench: fused and unfused outputs disagree: {name}", file=sys.stderr)
    for err in result["errors"]:
        print(f"\nfusion bench: {err['section']} / {err['workload']} failed: {err['error']}", file=sys.stderr)
    if args.json:
        result["environment"] = env
        write_json(args.json, result)
    return 1 if bad or result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
