"""Whole-step replay benchmark: the seed-CNN training step eager against ``ember.compile`` (captured and replayed),
on ``flex+autodiff`` and ``opencl+autodiff`` (when an OpenCL device is present), with PyTorch CPU in the same run.

1. **train**: the step ``cross_entropy(model(x), y).backward(); opt.step(); opt.zero_grad()`` (Adam, lr 1e-3, the
   suite's weights and batches) at batch 16 and 64 (``--quick``: 16 only). The eager and the compiled step train two
   copies of the model from the same weights, alternating inside every repeat; each timed call reads the loss and
   syncs the device with it alive. Reports ms medians with spread, the replay speedup (eager time / replayed time;
   target >= 1.5x) and the compiled function's counters (replays, recordings, graph breaks, backend calls recorded
   and kernel calls a replay makes per step).
   Before timing, eager and compiled runs of ``CHECK_STEPS`` steps from the same weights and dropout seed are
   compared: ``identical`` (bit for bit, expected on flex) and ``max_rel_diff`` of the losses.
2. **profile**: where a replayed step's time goes: cProfile over ``PROFILE_STEPS`` replayed steps at batch 16, split
   into the backend's kernels (by function) and ember.compile's own Python (binding slots, building arguments,
   rebinding state), against the same split of the eager step (dispatch, autodiff and fusion bookkeeping).

Usage::

    ember bench compile [--quick] [--json PATH] [--sections SECTION ...]
    python benchmarks/compile.py [--quick] [--json PATH] [--sections SECTION ...]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench compile` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

from _common import bench_parser, describe_environment, environment, write_json  # noqa: E402
from micro import TORCH, figure, format_table, measure  # noqa: E402
from opencl import opencl_device  # noqa: E402
from suite import _optimizers, batch_numpy, ember_model, torch_train_step  # noqa: E402

import ember  # noqa: E402
import ember.nn.functional as F  # noqa: E402
from ember import Device  # noqa: E402

SECTIONS = ("train", "profile")
TARGET = 1.5  # replay speedup (eager time / replayed time)
CHECK_STEPS = 4
PROFILE_STEPS = 5
#: where a profile's kernel time is (backend plugins, numpy, the OpenCL runtime; "~" marks C builtins)
_KERNEL_FILES = ("ember_flex", "ember_opencl", "numpy", "pyopencl")


def _step(dev: Device, batch: int, compiled: bool, seed: int = 0) -> Callable[[], float]:
    """A seed-CNN training step on ``dev`` (an autodiff device), eager or through ember.compile; calling it runs
    one step and returns the loss (read, and the device synced, with the result alive)."""
    m = ember_model("cnn", dev)
    m.train()
    opt = _optimizers("cnn")[0](m.parameters())
    x_np, y_np = batch_numpy("cnn", batch)
    x, y = ember.tensor(x_np, device=dev), ember.tensor(y_np, device=dev)

    def step(x: Any, y: Any) -> Any:
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = ember.compile(step) if compiled else step

    def call() -> float:
        loss = fn(x, y)
        value = float(loss.item())
        dev.sync()
        return value

    call.fn = fn  # type: ignore[attr-defined]
    return call


def _check(dev: Device, batch: int) -> dict[str, Any]:
    """Eager and compiled losses over CHECK_STEPS steps from the same weights and dropout seed."""
    runs = []
    for compiled in (False, True):
        call = _step(dev, batch, compiled)
        dev.seed(1234)
        runs.append([call() for _ in range(CHECK_STEPS)])
    a, b = np.array(runs[0]), np.array(runs[1])
    return {"identical": bool(np.array_equal(a, b)),
            "max_rel_diff": float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30))}


def bench_train(backends: Sequence[tuple[str, Device]], batches: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    out = []
    for batch in batches:
        cases: dict[str, Callable[[], Any]] = {}
        compiled: dict[str, Any] = {}
        checks: dict[str, dict[str, Any]] = {}
        for name, dev in backends:
            checks[name] = _check(dev, batch)
            cases[f"{name} eager"] = _step(dev, batch, False)
            cases[f"{name} replay"] = c = _step(dev, batch, True)
            compiled[name] = c.fn
        try:
            cases[TORCH] = torch_train_step("cnn", batch)
        except ImportError:
            pass
        s = measure(cases, repeats, number=1, warmup=3)  # warm-up: the recording calls (state created, steady)
        for name, _dev in backends:
            eager, replay = s[f"{name} eager"]["median"], s[f"{name} replay"]["median"]
            mine = {k: v for k, v in s.items() if k.startswith(name + " ") or k == TORCH}
            st = compiled[name].stats()
            speedup = eager / replay
            out.append(figure("train", f"seed-CNN step, batch {batch}, {name}: replayed vs eager", "ms", mine,
                              ember_case=f"{name} replay", torch_case=TORCH, backend=name, speedup=speedup,
                              target=TARGET, met=speedup >= TARGET, stats=st, **checks[name],
                              note=(f"replay {speedup:.2f}x faster than eager (target {TARGET}x); "
                                    f"{st['records']} records -> {st['kernels']} kernel calls/step; "
                                    f"replays {st['replays']}, "
                                    f"breaks {st['graph_breaks']}; eager==replay bit for bit: "
                                    f"{checks[name]['identical']} (max rel diff {checks[name]['max_rel_diff']:.2e})")))
    return out


def _split(stats: pstats.Stats, steps: int) -> dict[str, Any]:
    """ms per step: total, backend kernels (functions in a backend plugin or numpy), ember.compile's own code and
    the rest (core dispatch, autodiff, fusion), with the top kernel functions."""
    total = kernels = own = 0.0
    top: list[tuple[float, str]] = []
    for (file, _line, fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        if any(k in file for k in _KERNEL_FILES) or file.startswith("~"):
            kernels += tt
            top.append((tt, f"{Path(file).name}:{fn}" if not file.startswith("~") else fn))
        elif file.endswith(str(Path("ember") / "compile.py")):
            own += tt
    top.sort(reverse=True)
    k = 1e3 / steps
    return {"total_ms": total * k, "kernels_ms": kernels * k, "compile_python_ms": own * k,
            "other_python_ms": (total - kernels - own) * k, "top": [(n, t * k) for t, n in top[:6]]}


def bench_profile(backends: Sequence[tuple[str, Device]], batch: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, dev in backends:
        res = {}
        for label, compiled in (("eager", False), ("replay", True)):
            call = _step(dev, batch, compiled)
            for _ in range(3):
                call()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(PROFILE_STEPS):
                call()
            prof.disable()
            res[label] = _split(pstats.Stats(prof), PROFILE_STEPS)
        out[name] = res
    return out


def format_profile(profile: dict[str, Any]) -> str:
    lines = ["where the time goes (cProfile, ms per step; kernels = backend plugin and numpy functions):"]
    for name, res in profile.items():
        for label, p in res.items():
            top = ", ".join(f"{n} {t:.1f}" for n, t in p["top"])
            lines.append(f"  {name} {label}: total {p['total_ms']:.1f}, kernels {p['kernels_ms']:.1f}, "
                         f"ember.compile {p['compile_python_ms']:.1f}, other Python {p['other_python_ms']:.1f}; "
                         f"top kernels: {top}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("ember compile: the seed-CNN training step eager vs captured and replayed "
                          "(ember.compile) on flex and OpenCL, with PyTorch", "batch 16 only, fewer repeats",
                          SECTIONS)
    args = parser.parse_args(argv)
    env = environment()
    sections = [s for s in SECTIONS if s in (args.sections or SECTIONS)]
    ocl, desc = opencl_device()
    backends = [("flex", Device.flex().autodiff())]
    if ocl is not None and not args.quick:
        backends.append(("opencl", ocl.autodiff()))
    print(describe_environment(env))
    print(f"opencl: {desc}" if ocl is not None else f"opencl: skipped, no OpenCL device ({desc})")
    if ocl is not None and args.quick:
        print("opencl: skipped by --quick (cold kernel compiles of a training step take tens of seconds)")
    print("times: median of >= 5 alternating repeats after warm-up; spread = min..max and IQR; the 'ember' column "
          "is the replayed step; speedup = eager time / replayed time\n")
    result: dict[str, Any] = {"benchmark": "compile", "quick": args.quick, "sections": sections,
                              "backends": [n for n, _ in backends], "figures": [], "profile": None}
    if "train" in sections:
        result["figures"] = bench_train(backends, (16,) if args.quick else (16, 64), 5 if args.quick else 7)
        print(format_table(result["figures"]))
    if "profile" in sections:
        result["profile"] = bench_profile(backends, 16)
        print("\n" + format_profile(result["profile"]))
    bad = [f["name"] for f in result["figures"] if f["backend"] == "flex" and not f["identical"]]
    for name in bad:
        print(f"\ncompile bench: eager and replayed losses differ on flex: {name}", file=sys.stderr)
    if args.json:
        result["environment"] = env
        write_json(args.json, result)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
