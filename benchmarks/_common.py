"""Helpers shared by the benchmark scripts: timing loops, statistics, environment, peak-RSS probes, JSON output.

Scripts import it as a sibling module (``import _common``); each script puts its own directory on ``sys.path``
first, because ``ember bench NAME`` loads the script by file path. Nothing here imports ember or numpy at module
level, so overhead.py's cold-import figure is unaffected.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

#: results kept alive per realization in per-op rows (``hold``): each result is still realized before the clock
#: stops, but one device sync serves this many tiny ops instead of adding its fixed cost to every one of them
PER_OP_HOLD = 64


def _syncs(values: Any) -> list[Callable[[], None]]:
    """The ``sync`` of every ember device that holds a tensor among values (walking tuples, lists, dicts)."""
    from ember import Tensor

    devices: dict[Any, None] = {}
    stack = [values]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is tuple or t is list:
            stack.extend(v)
        elif t is dict:
            stack.extend(v.values())
        elif isinstance(v, Tensor):
            devices[v.device] = None
    return [d.sync for d in devices]


def realize(*values: Any) -> None:
    """Finish the work that produced values: sync every ember device holding one of them, while they are alive.

    A lazily recording device (ember-fusion, on by default) computes only what a live tensor can still read, when
    something reads it or the device syncs; a benchmark that drops its result before that times the recording, not
    the compute. Syncing with the results alive runs their pending graphs (and waits for asynchronous queues, as on
    OpenCL). numpy arrays, Python numbers and PyTorch CPU tensors are computed already and need nothing.
    """
    for sync in _syncs(values):
        sync()


def time_loop(fn: Callable[[], Any], number: int, realize_results: bool = True, hold: int = 1) -> float:
    """Seconds per call of fn, over a loop of number calls.

    With ``realize_results`` (the default) every result is realized (:func:`realize`) inside the timed loop: fn's
    results are kept alive, ``hold`` at a time, and the devices holding them are synced after each ``hold`` calls
    (``hold=1``: after every call). Without it results are dropped as they come, which on a lazily recording
    device times only the recording (fusion.py's "recorded only" rows want exactly that).
    """
    if not realize_results:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number
    hold = max(1, min(hold, number))
    held: list[Any] = [None] * hold
    syncs: list[Callable[[], None]] | None = None
    full, rest = divmod(number, hold)
    chunk = range(hold)
    t0 = time.perf_counter()
    for _ in range(full):
        for i in chunk:
            held[i] = fn()
        if syncs is None:  # the devices of fn's results, found once (a case's results live on the same devices)
            syncs = _syncs(held)
        for sync in syncs:
            sync()
    if rest:
        for i in range(rest):
            held[i] = fn()
        for sync in _syncs(held[:rest]) if syncs is None else syncs:
            sync()
    elapsed = time.perf_counter() - t0
    del held
    return elapsed / number


def sample_cases(cases: dict[str, Callable[[], Any]], repeats: int, number: int = 1, warmup: int = 1,
                 realize_results: bool = True, hold: int = 1) -> dict[str, list[float]]:
    """Seconds per call of every case: ``warmup`` untimed calls each, then ``repeats`` samples of a
    :func:`time_loop` of ``number`` calls, alternating (:func:`alternate`). Every benchmark row of ember's scripts is
    timed through this one function (looked up on this module at call time), so tests/test_bench_realizes.py can
    run each row once and count the work it did."""
    for fn in cases.values():
        for _ in range(warmup):
            out = fn()
            if realize_results:
                realize(out)
            del out
    return alternate(cases, repeats, lambda f: time_loop(f, number, realize_results, hold))


def stats(samples: list[float]) -> dict[str, float]:
    """Median, min, max, quartiles and IQR of samples."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0], s[0], s[0]]
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "q1": q[0], "q3": q[2], "iqr": q[2] - q[0]}


def alternate(cases: dict[str, Callable[[], Any]], repeats: int, run: Callable[[Callable[[], Any]], float]
              ) -> dict[str, list[float]]:
    """Samples of run(case) per case, rotating the order each repeat so drift hits every case alike."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(repeats):
        # rotate the order each repeat so no case always runs first (or right after another's garbage)
        for name in names[r % len(names):] + names[: r % len(names)]:
            samples[name].append(run(cases[name]))
    return samples


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _numpy_blas() -> str:
    import numpy as np

    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # numpy < 1.26 has no dict mode
        return "unknown"


def environment() -> dict[str, Any]:
    """Where the numbers come from (written with --json)."""
    import numpy as np

    import ember

    env: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numpy_blas": _numpy_blas(),
        "ember": ember.__version__,
        "torch": None,
        "torch_threads": None,
        # process-wide (flex tunes malloc when its backend is created): torch's rows in this process get it too
        "host_allocator": ember.Device.flex().memory_report().get("allocator"),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return env


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _release_free_heap() -> None:
    """Return the C allocator's free memory to the system where it can (glibc's ``malloc_trim``); a no-op
    elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_rss_growth(step: Callable[[], Any]) -> dict[str, int]:
    """Peak RSS growth of this process over one call of step (run it in a fresh process, after a warm-up)."""
    gc.collect()
    _release_free_heap()  # memory freed before the step (a model's initial weights replaced by loaded ones, say)
    # would otherwise stay with the allocator, and the step would reuse it instead of growing
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec, so a child started by a big parent
    # would report the parent's peak. Resetting the high-water mark (clear_refs "5") drops the warm-up's peak.
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass  # then the warm-up's (smaller) peak stays in VmHWM, which only matters if it exceeds this step's
    before = status_bytes("VmRSS")
    step()
    return {"rss_before_bytes": before, "peak_rss_delta_bytes": max(status_bytes("VmHWM") - before, 0)}


def run_rss_probe(script: str, probe_args: Sequence[str], label: str) -> int | None:
    """Peak RSS growth reported by ``script --rss-probe *probe_args`` in a fresh interpreter (None if unavailable);
    ``label`` prefixes the error printed when the probe fails."""
    if not os.path.exists("/proc/self/status"):
        return None
    proc = subprocess.run([sys.executable, script, "--rss-probe", *probe_args], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{label} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_delta_bytes"])


def write_json(path: str, result: dict[str, Any]) -> None:
    """Write result to path and say so."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {path}")


def bench_parser(description: str, quick_help: str, sections: Sequence[str], flag: str = "--sections"
                 ) -> argparse.ArgumentParser:
    """The options every benchmark script takes: --quick, --json PATH and a choice of sections."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", metavar="PATH", help="write results and environment to PATH")
    parser.add_argument(flag, nargs="+", choices=sections, metavar="SECTION",
                        help=f"run only these sections ({', '.join(sections)})")
    return parser


def describe_environment(env: dict[str, Any], device: str | None = None) -> str:
    """The header line of a benchmark's output: ember, the device (or host CPU), numpy's BLAS and torch."""
    host = f"{env['cpu']} ({env['cpu_count']} CPUs)"
    where = f"{device}; host {host}" if device else host
    alloc = env.get("host_allocator")
    return (f"ember {env['ember']} on {where}, numpy {env['numpy']} ({env['numpy_blas']}), "
            f"torch {env['torch'] or 'not installed'}" + (f" ({env['torch_threads']} threads)" if env["torch"] else "")
            + (f"; {alloc}, for both libraries in this process" if alloc else ""))
