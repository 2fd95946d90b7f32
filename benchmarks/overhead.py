"""Per-op eager overhead and cold import time (the foundation issue's measurement).

Measures, in one run and side by side:

* ``a + b`` on 1,000 float32 elements: ember on flex, numpy, and PyTorch (CPU, when installed). The frameworks
  are timed alternately inside every repeat, so drift (turbo, other load) hits all of them alike. Each repeat
  times a loop of ``number`` calls whose results are kept alive and realized (ember's device synced) every 64
  calls; the per-op time is the median over repeats, with min/max and IQR as spread.
* cold ``import ember`` in fresh interpreters (median of 5), and whether that import pulled in a backend module
  (``ember_flex``) or the plugin machinery (``pluggy``) -- discovery must be lazy.

Usage::

    python benchmarks/overhead.py                 # full run (about 5 s)
    python benchmarks/overhead.py --quick         # CI smoke (about 2.5 s)
    python benchmarks/overhead.py --json out.json # also write results + environment
    ember bench [--quick] [--json PATH]           # the same, through the CLI
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench overhead` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

import _common  # noqa: E402
from _common import PER_OP_HOLD, environment, stats, write_json  # noqa: E402

N_ELEMENTS = 1000

_IMPORT_PROBE = """
import sys, time, json
t0 = time.perf_counter()
import ember
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "ember_flex": "ember_flex" in sys.modules, "pluggy": "pluggy" in sys.modules,
                  "torch": "torch" in sys.modules}))
"""


def bench_add(repeats: int, number: int) -> dict[str, dict[str, float]]:
    """Per-op time of a + b (1,000 float32) for every framework present; values in seconds."""
    import numpy as np

    import ember

    rng = np.random.default_rng(0)
    a_np = rng.standard_normal(N_ELEMENTS, dtype=np.float32)
    b_np = rng.standard_normal(N_ELEMENTS, dtype=np.float32)

    dev = ember.Device.flex()
    a_em = ember.tensor(a_np, device=dev)
    b_em = ember.tensor(b_np, device=dev)
    # check the thing we time computes the right answer before timing it
    if not np.allclose((a_em + b_em).numpy(), a_np + b_np):
        raise SystemExit("overhead: ember a + b disagrees with numpy")

    cases: dict[str, Callable[[], Any]] = {
        "ember (flex)": lambda: a_em + b_em,
        "numpy": lambda: a_np + b_np,
    }
    try:
        import torch

        a_t = torch.from_numpy(a_np.copy())
        b_t = torch.from_numpy(b_np.copy())
        cases["torch (cpu)"] = lambda: a_t + b_t
    except ImportError:
        pass

    # warm-up (caches, lazy imports, allocator pools), then alternating repeats; every result is realized in the
    # timed loop, one device sync per PER_OP_HOLD results (a + b on 1,000 elements runs at once even on a fused
    # device; the sync makes sure of it without adding its fixed cost to every op)
    samples = _common.sample_cases(cases, repeats, number, max(number // 10, 10), hold=PER_OP_HOLD)
    return {name: stats(s) for name, s in samples.items()}


def bench_import(runs: int) -> dict[str, Any]:
    """Cold `import ember` in fresh interpreters: seconds (in-process, without interpreter start-up)."""
    times: list[float] = []
    leaked: set[str] = set()
    # Bytecode caching on, as on a user's machine (some CI shells export PYTHONDONTWRITEBYTECODE, which would
    # measure compiling ember's sources instead of importing them); the first, untimed run writes the caches.
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "PYTHONDONTWRITEBYTECODE")}
    subprocess.run([sys.executable, "-c", _IMPORT_PROBE], capture_output=True, text=True, check=True, env=env)
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE], capture_output=True, text=True, check=True, env=env
        )
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        times.append(rec["seconds"])
        leaked.update(k for k in ("ember_flex", "pluggy", "torch") if rec[k])
    return {**stats(times), "runs": runs, "imported_by_import_ember": sorted(leaked)}


def _us(x: float) -> str:
    return f"{x * 1e6:8.2f}"


def report(add: dict[str, dict[str, float]], imp: dict[str, Any], repeats: int, number: int) -> str:
    lines = [
        f"a + b, {N_ELEMENTS} float32 elements: per-op time in microseconds "
        f"(median of {repeats} repeats x {number} calls, alternating)",
        f"  {'framework':<14}{'median':>9}{'min':>9}{'max':>9}{'IQR':>9}",
    ]
    for name, s in add.items():
        lines.append(f"  {name:<14}{_us(s['median'])} {_us(s['min'])} {_us(s['max'])} {_us(s['iqr'])}")
    em = add["ember (flex)"]["median"]
    lines.append(f"  ratio ember/numpy: {em / add['numpy']['median']:.2f}x")
    if "torch (cpu)" in add:
        lines.append(f"  ratio ember/torch: {em / add['torch (cpu)']['median']:.2f}x")
    else:
        lines.append("  ratio ember/torch: n/a (PyTorch not installed)")
    lines.append("")
    lines.append(
        f"cold `import ember`: median {imp['median'] * 1e3:.1f} ms (min {imp['min'] * 1e3:.1f}, "
        f"max {imp['max'] * 1e3:.1f}) over {imp['runs']} fresh interpreters"
    )
    leaked = imp["imported_by_import_ember"]
    lines.append(
        "  modules loaded by `import ember`: ember_flex "
        + ("YES (discovery is not lazy!)" if "ember_flex" in leaked else "no")
        + ", pluggy "
        + ("YES" if "pluggy" in leaked else "no")
        + ", torch "
        + ("YES" if "torch" in leaked else "no")
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ember per-op overhead and import time")
    parser.add_argument("--quick", action="store_true", help="few, short repeats (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="write results and environment to PATH")
    args = parser.parse_args(argv)

    repeats, number, import_runs = (7, 2000, 3) if args.quick else (15, 20000, 5)
    add = bench_add(repeats, number)
    imp = bench_import(import_runs)
    print(report(add, imp, repeats, number))

    if args.json:
        result = {
            "benchmark": "overhead",
            "quick": args.quick,
            "elements": N_ELEMENTS,
            "repeats": repeats,
            "number": number,
            "add_seconds_per_op": add,
            "ratio_ember_numpy": add["ember (flex)"]["median"] / add["numpy"]["median"],
            "ratio_ember_torch": (
                add["ember (flex)"]["median"] / add["torch (cpu)"]["median"] if "torch (cpu)" in add else None
            ),
            "import_ember_seconds": imp,
            "environment": environment(),
        }
        write_json(args.json, result)
    # a backend imported by `import ember` breaks the lazy-discovery guarantee: fail loudly
    return 1 if "ember_flex" in imp["imported_by_import_ember"] else 0


if __name__ == "__main__":
    sys.exit(main())
