"""OpenCL backend benchmark: the figures of the OpenCL issue's closing note, on ``Device.opencl(0)``.

1. **matmul GFLOP/s**, float32: 1024x1024 @ 1024x1024 and 64x1600 @ 1600x128 (the seed CNN's first Linear),
   ember on OpenCL (each product's device synced inside the timed region with the product alive: ops are
   asynchronous) against ``np.matmul`` and
   PyTorch CPU (when installed) in the same run; % of numpy.
2. **Seed-CNN training step** (forward, cross-entropy, backward, Adam lr 1e-3; batch 64 and 256):
   ``Device.opencl(0).autodiff()`` against ``Device.flex().autodiff()`` and PyTorch CPU, same weights (suite.py's
   helpers), same batch; the step ends with ``loss.item()``, which waits for the device.
3. **Cold vs warm first step**: a fresh interpreter times building the seed CNN on OpenCL and running its first
   training step, once with empty ``EMBER_CACHE_DIR`` (ember's program binaries and autotune results) and
   ``POCL_CACHE_DIR`` (PoCL's own kernel cache) and again reusing both; also the process wall time and the kernel
   cache counters (``memory_report()["kernels"]``) of each run. Target: warm >= 5x faster.
4. **Pool memory** of one seed-CNN step (batch 64), each mode in a fresh interpreter: warm-up step, then one step
   under ``dev.memory_dry_run()`` (or, without a dry run, a plain second step), then the pool's peak is reset and
   one measured step runs. Reports in_use, reserved, peak and reserved/peak (target <= 1.2 with the dry run).

Every timed figure is the median over >= 5 alternating repeats after warm-up, with min/max/IQR as spread; ratios
are of median times (> 1: the first case is slower).

Usage::

    ember bench opencl [--quick] [--json PATH] [--sections SECTION ...]
    python benchmarks/opencl.py [--quick] [--json PATH] [--sections SECTION ...]

``--quick`` (CI smoke) shrinks sizes and batches and runs the cold/warm section on a matmul-only workload (cold
compiles of the whole CNN take tens of seconds on a CPU runtime). Sections: matmul, cnn, coldwarm, memory. Without
an OpenCL device the script says so and exits 0 (the JSON then has ``"available": false``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench opencl` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

from _common import bench_parser, describe_environment, environment, write_json  # noqa: E402
from micro import EMBER_AD, NUMPY, TORCH, figure, format_table, measure, torch_module  # noqa: E402
from suite import batch_numpy, ember_model, ember_train_step, torch_train_step  # noqa: E402

import ember  # noqa: E402
from ember import Device  # noqa: E402
from ember.errors import EmberError  # noqa: E402

SECTIONS = ("matmul", "cnn", "coldwarm", "memory")
OCL = "ember opencl"
OCL_AD = "ember opencl+autodiff"
WORKLOADS = ("cnn", "matmul")  # of the cold/warm probe
MEMORY_MODES = ("dry_run", "no_dry_run")
PROBE_TIMEOUT = 1200  # seconds; a cold CNN compile on a slow CPU runtime takes a minute or two


# ----------------------------------------------------------------------------------------------------------
# devices, models and steps
# ----------------------------------------------------------------------------------------------------------
def opencl_device() -> tuple[Device | None, str]:
    """(Device.opencl(0), its description), or (None, why not) when there is no usable OpenCL device."""
    try:
        dev = Device.opencl(0)
        return dev, dev.stack.describe()  # creates the runtime: context, queue, pool
    except EmberError as exc:
        return None, str(exc)


def opencl_backend(dev: Device) -> Any:
    """The OpenCL backend object under the device's decorators (autodiff wraps it in ``.inner``)."""
    stack = dev.stack
    while getattr(stack, "rt", None) is None:
        inner = getattr(stack, "inner", None)
        if inner is None:
            raise SystemExit(f"opencl bench: no OpenCL backend under {dev} (stack {type(dev.stack).__name__})")
        stack = inner
    return stack


def train_step(dev: Device, batch: int) -> Callable[[], float]:
    """A seed-CNN training step on ``dev`` (an autodiff device): suite.py's model and weights, Adam lr 1e-3."""
    return ember_train_step("cnn", batch, dev)


def check_cnn_forward(batch: int) -> float:
    """Relative error of the seed CNN's eval-mode logits on OpenCL against flex (same weights and batch);
    timing two models that compute different things would be meaningless."""
    x_np, _ = batch_numpy("cnn", batch)
    logits = []
    for dev in (Device.opencl(0), Device.flex()):
        m = ember_model("cnn", dev)
        m.eval()
        with ember.no_grad():
            logits.append(m(ember.tensor(x_np, device=dev)).numpy())
    err = float(np.max(np.abs(logits[0] - logits[1])) / max(float(np.max(np.abs(logits[1]))), 1e-12))
    if not err < 1e-3:
        raise SystemExit(f"opencl bench: seed-CNN logits on OpenCL disagree with flex (relative error {err:.2g})")
    return err


# ----------------------------------------------------------------------------------------------------------
# 1. matmul
# ----------------------------------------------------------------------------------------------------------
def bench_matmul(shapes: Sequence[tuple[int, int, int, str]], repeats: int) -> list[dict[str, Any]]:
    """float32 (M, K) @ (K, N) GFLOP/s on OpenCL vs np.matmul (and torch); the first product also autotunes."""
    torch = torch_module()
    dev = Device.opencl(0)
    rng = np.random.default_rng(1)
    out = []
    for m, k, n, label in shapes:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        ea, eb = ember.tensor(a, device=dev), ember.tensor(b, device=dev)
        ref = a @ b
        err = float(np.max(np.abs((ea @ eb).numpy() - ref)) / max(float(np.max(np.abs(ref))), 1e-12))
        if not err < 1e-4:
            raise SystemExit(f"opencl bench: matmul {m}x{k} @ {k}x{n} on OpenCL disagrees with numpy "
                             f"(relative error {err:.2g})")

        # measure realizes each product: the device syncs while the result is alive (ops are asynchronous, and a
        # result dropped before the sync may be released, or on a lazily recording device never computed)
        cases: dict[str, Callable[[], Any]] = {OCL: partial(ember.matmul, ea, eb),
                                               NUMPY: lambda a=a, b=b: np.matmul(a, b)}
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            cases[TORCH] = lambda ta=ta, tb=tb: torch.matmul(ta, tb)
        number = max(1, int(2e8 // (m * k * n)))  # keep each sample >~ tens of ms for the small product
        s = measure(cases, repeats, number)
        work = 2.0 * m * k * n / 1e9
        out.append(figure("matmul", f"{m}x{k} @ {k}x{n} f32 ({label})", "GFLOP/s", s, work=work, ember_case=OCL,
                          pct_of_numpy=100.0 * s[NUMPY]["median"] / s[OCL]["median"],
                          gflops={case: work / st["median"] for case, st in s.items()},
                          note=f"rel. err vs numpy {err:.1e}"))
    return out


# ----------------------------------------------------------------------------------------------------------
# 2. seed-CNN training step
# ----------------------------------------------------------------------------------------------------------
def bench_cnn(batch: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Seconds per seed-CNN training step: OpenCL+autodiff, flex+autodiff and torch, alternating."""
    err = check_cnn_forward(min(batch, 16))
    cases: dict[str, Callable[[], Any]] = {OCL_AD: train_step(Device.opencl(0).autodiff(), batch),
                                           EMBER_AD: train_step(Device.flex().autodiff(), batch)}
    if torch_module() is not None:
        cases[TORCH] = torch_train_step("cnn", batch)
    s = measure(cases, repeats, 1, warmup)
    return figure("cnn", f"seed-CNN train step, batch {batch} (Adam)", "ms", s, ember_case=OCL_AD,
                  ratio_opencl_flex=s[OCL_AD]["median"] / s[EMBER_AD]["median"],
                  note=f"eval logits rel. err vs flex {err:.1e}")


# ----------------------------------------------------------------------------------------------------------
# 3. cold vs warm first step (runs in fresh interpreters)
# ----------------------------------------------------------------------------------------------------------
def first_step_probe(workload: str, batch: int) -> dict[str, Any]:
    """In the child: seconds from just before building the workload to the end of its first step, and the kernel
    cache counters. ``cnn``: the seed CNN's first training step; ``matmul``: (batch, 128) @ (128, 64) plus a sum
    (small enough for the untuned kernel: a smoke-sized workload)."""
    t0 = time.perf_counter()
    dev = Device.opencl(0).autodiff()
    opencl_backend(dev)  # create the runtime (context, queue): the same cost cold or warm, reported apart
    t1 = time.perf_counter()
    if workload == "cnn":
        loss = train_step(dev, batch)()
    else:
        rng = np.random.default_rng(1)
        a = ember.tensor(rng.standard_normal((batch, 128), dtype=np.float32), device=dev)
        b = ember.tensor(rng.standard_normal((128, 64), dtype=np.float32), device=dev)
        loss = float((a @ b).sum().item())
    t2 = time.perf_counter()
    kernels = dict(dev.memory_report()["kernels"])
    tune = opencl_backend(dev).rt.tune
    tune_file = getattr(tune, "path", None)
    return {"runtime_init_seconds": t1 - t0, "first_step_seconds": t2 - t1, "loss": loss, "kernels": kernels,
            "tune_file": bool(tune_file is not None and Path(tune_file).is_file())}


def _run_child(args: Sequence[str], env: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    """(last JSON line of ``this script *args`` in a fresh interpreter, its wall seconds); SystemExit on failure."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                          env=env, timeout=PROBE_TIMEOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"opencl bench: probe {' '.join(args)} failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bench_cold_warm(workload: str, batch: int, warm_runs: int) -> dict[str, Any]:
    """The first step cold (fresh EMBER_CACHE_DIR and POCL_CACHE_DIR) and warm (the same dirs again)."""
    root = Path(tempfile.mkdtemp(prefix="ember-bench-opencl-"))
    try:
        env = dict(os.environ)
        env["EMBER_CACHE_DIR"] = str(root / "ember")
        env["POCL_CACHE_DIR"] = str(root / "pocl")
        env.pop("POCL_KERNEL_CACHE", None)  # PoCL's default: cache on
        probe = ["--first-step-probe", workload, str(batch)]
        runs = []
        for i in range(1 + warm_runs):
            res, wall = _run_child(probe, env)
            res["process_seconds"] = wall
            res["kind"] = "cold" if i == 0 else "warm"
            runs.append(res)
            if i == 0:
                cache_bytes = {"ember": _dir_bytes(root / "ember"), "pocl": _dir_bytes(root / "pocl")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cold, warm = runs[0], runs[1:]
    warm_first = statistics.median(r["first_step_seconds"] for r in warm)
    warm_proc = statistics.median(r["process_seconds"] for r in warm)
    what = ("seed-CNN first training step (build model + forward, backward, Adam)" if workload == "cnn" else
            f"matmul only: {batch}x128 @ 128x64 + sum (quick mode; not the seed CNN)")
    return {
        "workload": workload, "description": what, "batch": batch, "warm_runs": warm_runs,
        "cold": cold, "warm": warm,
        "first_step_seconds": {"cold": cold["first_step_seconds"], "warm": warm_first},
        "process_seconds": {"cold": cold["process_seconds"], "warm": warm_proc},
        "ratio_cold_warm": cold["first_step_seconds"] / warm_first,
        "ratio_cold_warm_process": cold["process_seconds"] / warm_proc,
        "cache_bytes_after_cold": cache_bytes,
        "target_ratio": 5.0,
    }


# ----------------------------------------------------------------------------------------------------------
# 4. pool memory (runs in fresh interpreters)
# ----------------------------------------------------------------------------------------------------------
_PLAN_KEYS = ("allocations", "frees", "carried", "kept", "peak_in_use", "per_size_bytes", "plan_bytes", "reserved")
_POOL_KEYS = ("in_use", "reserved", "peak", "peak_reserved", "held", "cached", "raw_allocations", "raw_releases",
              "plan_allocations", "plan_reserved", "live_blocks")


def memory_probe(mode: str, batch: int) -> dict[str, Any]:
    """In the child: pool figures of one seed-CNN step after a warm-up step and a dry-run (or plain) step."""
    dev = Device.opencl(0).autodiff()
    pool = opencl_backend(dev).rt.pool
    step = train_step(dev, batch)
    step()  # warm-up: Adam state, kernels, autotuning
    plan: dict[str, Any] = {}
    if mode == "dry_run":
        with dev.memory_dry_run() as plan:
            step()
    else:
        step()  # the same number of steps, served by the size-class pools
    gc.collect()  # blocks are returned when their handles die; autodiff graphs can hold cycles
    pool.reset_peak()
    before = pool.report()
    step()
    gc.collect()
    after = pool.report()
    out: dict[str, Any] = {k: after[k] for k in _POOL_KEYS}
    out["reserved_over_peak"] = after["reserved"] / after["peak"]
    # without a plan the pools may release buffers mid-step, leaving reserved below the step's peak at the end
    out["peak_reserved_over_peak"] = after["peak_reserved"] / after["peak"]
    out["raw_allocations_in_step"] = after["raw_allocations"] - before["raw_allocations"]
    out["plan_allocations_in_step"] = after["plan_allocations"] - before["plan_allocations"]
    out["dry_run"] = {k: plan[k] for k in _PLAN_KEYS if k in plan} or None
    return out


def bench_memory(batch: int) -> dict[str, Any]:
    """Pool figures with and without a dry run, each in its own interpreter (a fresh pool)."""
    modes = {mode: _run_child(["--memory-probe", mode, str(batch)])[0] for mode in MEMORY_MODES}
    return {"batch": batch, "modes": modes, "target_reserved_over_peak": 1.2}


# ----------------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------------
def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def format_extra(figures: list[dict[str, Any]]) -> str:
    """GFLOP/s per case and OpenCL/flex ratios, one line per figure (the table has the spreads)."""
    lines = []
    for fig in figures:
        if fig["section"] == "matmul":
            rates = ", ".join(f"{c} {v:.1f}" for c, v in fig["gflops"].items())
            lines.append(f"  {fig['name']}: GFLOP/s {rates}; OpenCL = {fig['pct_of_numpy']:.0f}% of numpy")
        elif fig["section"] == "cnn":
            ms = ", ".join(f"{c} {st['median'] * 1e3:.1f}" for c, st in fig["seconds"].items())
            lines.append(f"  {fig['name']}: ms {ms}; opencl/flex {fig['ratio_opencl_flex']:.2f}x"
                         + ("" if fig["ratio_ember_torch"] is None else
                            f", opencl/torch {fig['ratio_ember_torch']:.2f}x"))
    return "\n".join(lines)


def format_cold_warm(cw: dict[str, Any]) -> str:
    fs, ps = cw["first_step_seconds"], cw["process_seconds"]
    lines = [f"Cold vs warm first step on OpenCL: {cw['description']}, batch {cw['batch']}",
             "  (fresh interpreters; cold: empty EMBER_CACHE_DIR and POCL_CACHE_DIR, warm: the same dirs again; "
             f"warm = median of {cw['warm_runs']})",
             f"  {'':<6}{'first step s':>14}{'process s':>11}{'runtime init s':>16}  kernels"]
    for kind, run in (("cold", cw["cold"]), *(("warm", r) for r in cw["warm"])):
        k = run["kernels"]
        lines.append(f"  {kind:<6}{run['first_step_seconds']:14.2f}{run['process_seconds']:11.2f}"
                     f"{run['runtime_init_seconds']:16.2f}  compiled {k['compiled']:.0f} "
                     f"({k['compile_seconds']:.1f} s), disk_hits {k['disk_hits']:.0f}, "
                     f"disk_rejected {k['disk_rejected']:.0f}")
    ok = "met" if cw["ratio_cold_warm"] >= cw["target_ratio"] else "NOT met"
    cb = cw["cache_bytes_after_cold"]
    lines.append(f"  cold/warm: first step {cw['ratio_cold_warm']:.1f}x (target >= {cw['target_ratio']:.0f}x: {ok}), "
                 f"process {cw['ratio_cold_warm_process']:.1f}x; medians {fs['cold']:.2f} / {fs['warm']:.2f} s, "
                 f"process {ps['cold']:.2f} / {ps['warm']:.2f} s")
    lines.append(f"  caches after the cold run: ember {_mib(cb['ember'])} MiB, pocl {_mib(cb['pocl'])} MiB")
    recompiled = [int(r["kernels"]["compiled"]) for r in cw["warm"] if r["kernels"]["compiled"]]
    if recompiled:
        lines.append(f"  note: warm runs compiled {recompiled} program(s): kernel sources changed between runs, or a "
                     "program missed the disk cache")
    return "\n".join(lines)


def format_memory(mem: dict[str, Any]) -> str:
    lines = [f"Pool memory of one seed-CNN training step on OpenCL, batch {mem['batch']} (MiB; fresh interpreter per "
             "mode; peak reset before the measured step)",
             f"  {'mode':<12}{'in_use':>9}{'reserved':>10}{'peak':>9}{'reserved/peak':>15}{'peak reserved':>15}"
             f"{'new buffers':>13}{'plan':>9}"]
    for mode, m in mem["modes"].items():
        plan = m["dry_run"]["plan_bytes"] if m["dry_run"] else None
        lines.append(f"  {mode:<12}{_mib(m['in_use']):>9}{_mib(m['reserved']):>10}{_mib(m['peak']):>9}"
                     f"{m['reserved_over_peak']:>14.2f}x{_mib(m['peak_reserved']):>15}{m['raw_allocations_in_step']:>13}"
                     f"{'-' if plan is None else _mib(plan):>9}")
    r = mem["modes"]["dry_run"]["reserved_over_peak"]
    lines.append(f"  with dry run: reserved/peak {r:.2f}x (target <= {mem['target_reserved_over_peak']}: "
                 f"{'met' if r <= mem['target_reserved_over_peak'] else 'NOT met'}); peak reserved = most reserved "
                 "during the measured step; new buffers = raw device buffers created during it")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------
def plan(quick: bool) -> dict[str, Any]:
    """Sizes and repeat counts (>= 5 timed repeats everywhere; quick shrinks sizes and the cold/warm workload)."""
    linear = (64, 1600, 128, "seed-CNN fc1")
    if quick:
        return {"matmul": [(256, 256, 256, "square"), linear], "cnn": [8], "repeats": 5, "warmup": 1,
                "coldwarm": ("matmul", 16, 1), "memory": 8}
    return {"matmul": [(1024, 1024, 1024, "square"), linear], "cnn": [64, 256], "repeats": 7, "warmup": 2,
            "coldwarm": ("cnn", 64, 3), "memory": 64}


def run(quick: bool, sections: Sequence[str]) -> dict[str, Any]:
    p = plan(quick)
    result: dict[str, Any] = {"figures": [], "cold_warm": None, "memory": None, "section_seconds": {}}
    for section in sections:
        t0 = time.perf_counter()
        if section == "matmul":
            result["figures"] += bench_matmul(p["matmul"], p["repeats"])
        elif section == "cnn":
            result["figures"] += [bench_cnn(b, p["repeats"], p["warmup"]) for b in p["cnn"]]
        elif section == "coldwarm":
            result["cold_warm"] = bench_cold_warm(*p["coldwarm"])
        elif section == "memory":
            result["memory"] = bench_memory(p["memory"])
        result["section_seconds"][section] = time.perf_counter() - t0
        print(f"[{section}: {result['section_seconds'][section]:.1f} s]", file=sys.stderr, flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("ember OpenCL backend: matmul GFLOP/s, seed-CNN step vs flex and PyTorch, cold vs warm "
                          "first step, pool memory", "small sizes, matmul-only cold/warm (CI smoke)", SECTIONS)
    parser.add_argument("--first-step-probe", nargs=2, metavar=("WORKLOAD", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--memory-probe", nargs=2, metavar=("MODE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_step_probe:
        workload, batch = args.first_step_probe
        if workload not in WORKLOADS:
            parser.error(f"--first-step-probe: workload must be one of {WORKLOADS}, got {workload!r}")
        print(json.dumps(first_step_probe(workload, int(batch))))
        return 0
    if args.memory_probe:
        mode, batch = args.memory_probe
        if mode not in MEMORY_MODES:
            parser.error(f"--memory-probe: mode must be one of {MEMORY_MODES}, got {mode!r}")
        print(json.dumps(memory_probe(mode, int(batch))))
        return 0

    env = environment()
    sections = [s for s in SECTIONS if not args.sections or s in args.sections]
    dev, desc = opencl_device()
    base = {"benchmark": "opencl", "quick": args.quick, "sections": sections, "available": dev is not None}
    if dev is None:
        print(f"no OpenCL device: {desc}\nnothing to benchmark (`clinfo` lists what the OpenCL runtime sees)")
        if args.json:
            write_json(args.json, {**base, "reason": desc, "environment": env})
        return 0
    print(describe_environment(env, desc))
    print("times: median of >= 5 alternating repeats after warm-up; spread = min..max and IQR; ratios of median "
          "times (> 1: the first named is slower); the 'ember' column is OpenCL\n")
    result = {**base, "device": desc, **run(args.quick, sections)}
    if result["figures"]:
        print(format_table(result["figures"]))
        print("\n" + format_extra(result["figures"]))
    if result["cold_warm"]:
        print("\n" + format_cold_warm(result["cold_warm"]))
    if result["memory"]:
        print("\n" + format_memory(result["memory"]))
    if args.json:
        result["environment"] = env
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
