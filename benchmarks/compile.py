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

3. **memory**: peak memory of ``MEMORY_STEPS`` training steps, eager against compiled (its recording calls
   included), the seed-CNN at batch 64 and transformer-small (AdamW) at batch 8 (``--quick``: the CNN at batch
   16), each run in a fresh interpreter, eager and compiled alternating, ``MEMORY_ROUNDS`` rounds (medians, with
   min..max): the peak RSS growth over the steps (VmHWM) and, in separate runs, tracemalloc's peak of the traced
   allocations (numpy's array buffers included), the memory still held after the steps and, for the compiled
   step, after ``reset()`` (RSS there is what the allocator kept, not what ember holds). Target: compiled <= eager.
   ``--quick`` runs it only when named (``--sections memory``).

Usage::

    ember bench compile [--quick] [--json PATH] [--sections SECTION ...]
    python benchmarks/compile.py [--quick] [--json PATH] [--sections SECTION ...]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench compile` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

from _common import bench_parser, describe_environment, environment, status_bytes, write_json  # noqa: E402
from micro import TORCH, figure, format_table, measure  # noqa: E402
from opencl import opencl_device  # noqa: E402
from suite import _optimizers, batch_numpy, ember_model, ember_train_step, torch_train_step  # noqa: E402

import ember  # noqa: E402
import ember.nn.functional as F  # noqa: E402
from ember import Device  # noqa: E402

SECTIONS = ("train", "profile", "memory")
TARGET = 1.5  # replay speedup (eager time / replayed time)
CHECK_STEPS = 4
PROFILE_STEPS = 5
MEMORY_STEPS = 5  # a warm-up (optimizer state created), a recording, three replays
MEMORY_ROUNDS = 2
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


# ------------------------------------------------------------------------------------------------------------
# memory: eager vs compiled, each in a fresh interpreter
# ------------------------------------------------------------------------------------------------------------
def memory_probe(model: str, batch: int, mode: str, metric: str) -> dict[str, Any]:
    """In this (fresh) process: MEMORY_STEPS training steps of ``model`` on flex+autodiff, eager or compiled;
    ``metric`` "rss": peak RSS growth (VmHWM over the RSS before the first step) and the RSS growth held after;
    "traced": tracemalloc's peak above the traced memory before the first step, and what is held after (garbage
    collected). Compiled: also what is held after ``reset()``."""
    step = ember_train_step(model, batch, compiled=mode == "compiled")
    gc.collect()
    if metric == "rss":
        try:  # reset the high-water mark to the current RSS (the model's creation does not count)
            with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
        except OSError:
            pass
        before = status_bytes("VmRSS")

        def held() -> int:
            return status_bytes("VmRSS") - before
    else:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]

        def held() -> int:
            return tracemalloc.get_traced_memory()[0] - before
    for _ in range(MEMORY_STEPS):
        step()
    peak = status_bytes("VmHWM") - before if metric == "rss" else tracemalloc.get_traced_memory()[1] - before
    gc.collect()
    out: dict[str, Any] = {"peak": peak, "held": held()}
    if step.compiled is not None:
        st = step.compiled.stats()
        out["stats"] = {k: st[k] for k in ("replays", "recordings", "graph_breaks", "reason")}
        step.compiled.reset()
        gc.collect()
        out["held_after_reset"] = held()
    return out


def _probe(model: str, batch: int, mode: str, metric: str) -> dict[str, Any] | None:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory-probe", model, str(batch), mode,
                           metric], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"compile bench: memory probe {model}/{mode}/{metric} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _spread(values: list[int]) -> dict[str, float]:
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values))}


def bench_memory(cases: Sequence[tuple[str, int]], rounds: int, command: str) -> list[dict[str, Any]]:
    """Per model: eager and compiled probes alternating, ``rounds`` of each metric; medians with min..max."""
    out = []
    for model, batch in cases:
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(rounds):
            for metric in ("rss", "traced"):
                for mode in ("eager", "compiled"):
                    r = _probe(model, batch, mode, metric)
                    if r is not None:
                        runs.setdefault((mode, metric), []).append(r)
        fig: dict[str, Any] = {"section": "memory", "model": model, "batch": batch, "steps": MEMORY_STEPS,
                               "rounds": rounds, "unit": "bytes", "command": command}
        for (mode, metric), rs in runs.items():
            fig[f"{mode}_{metric}"] = {k: _spread([r[k] for r in rs]) for k in rs[0] if k != "stats"}
            if mode == "compiled":
                fig["stats"] = rs[-1]["stats"]
        for metric in ("rss", "traced"):
            e, c = fig.get(f"eager_{metric}"), fig.get(f"compiled_{metric}")
            fig[f"ratio_{metric}"] = None if not e or not c or e["peak"]["median"] <= 0 else \
                c["peak"]["median"] / e["peak"]["median"]
        out.append(fig)
    return out


def format_memory(figs: list[dict[str, Any]]) -> str:
    def mib(d: dict[str, Any] | None, key: str) -> str:
        if not d or key not in d:
            return "n/a"
        v = d[key]
        return f"{v['median'] / 2**20:.1f} ({v['min'] / 2**20:.1f}..{v['max'] / 2**20:.1f})"

    lines = [f"memory over {MEMORY_STEPS} training steps on flex+autodiff, fresh process per run, eager and compiled "
             "alternating; MiB, median (min..max); compiled includes its recording calls"]
    for f in figs:
        lines.append(f"  {f['model']} batch {f['batch']}  [{f['command']}]")
        for metric, label in (("rss", "RSS growth"), ("traced", "tracemalloc")):
            e, c = f.get(f"eager_{metric}"), f.get(f"compiled_{metric}")
            ratio = f.get(f"ratio_{metric}")
            lines.append(f"    {label:<12} peak: eager {mib(e, 'peak')}, compiled {mib(c, 'peak')}, compiled/eager "
                         f"{'n/a' if ratio is None else f'{ratio:.2f}x'}; held after: eager {mib(e, 'held')}, "
                         f"compiled {mib(c, 'held')}, after reset() {mib(c, 'held_after_reset')}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("ember compile: the seed-CNN training step eager vs captured and replayed "
                          "(ember.compile) on flex and OpenCL, with PyTorch", "batch 16 only, fewer repeats",
                          SECTIONS)
    parser.add_argument("--memory-probe", nargs=4, metavar=("MODEL", "BATCH", "MODE", "METRIC"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_probe:
        model, batch, mode, metric = args.memory_probe
        print(json.dumps(memory_probe(model, int(batch), mode, metric)))
        return 0
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
                              "backends": [n for n, _ in backends], "figures": [], "profile": None,
                              "memory": None}
    if "train" in sections:
        result["figures"] = bench_train(backends, (16,) if args.quick else (16, 64), 5 if args.quick else 7)
        print(format_table(result["figures"]))
    if "profile" in sections:
        result["profile"] = bench_profile(backends, 16)
        print("\n" + format_profile(result["profile"]))
    if "memory" in sections and args.quick and not args.sections:
        print("\nmemory: skipped by --quick (a fresh interpreter per probe; run --sections memory)")
    elif "memory" in sections:
        cases = [("cnn", 16)] if args.quick else [("cnn", 64), ("transformer-small", 8)]
        command = "ember bench compile --sections memory" + (" --quick" if args.quick else "")
        result["memory"] = bench_memory(cases, 1 if args.quick else MEMORY_ROUNDS, command)
        print("\n" + format_memory(result["memory"]))
    bad = [f["name"] for f in result["figures"] if f["backend"] == "flex" and not f["identical"]]
    for name in bad:
        print(f"\ncompile bench: eager and replayed losses differ on flex: {name}", file=sys.stderr)
    if args.json:
        result["environment"] = env
        write_json(args.json, result)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
