"""Per-op overhead of two checkouts in one run: ``a + b`` on 1,000 float32, old tree against new tree.

A refactor must not make the per-op path slower, and these machines are too noisy to compare figures taken at
different times. This script runs the same probe under each checkout's sources (``PYTHONPATH`` pointing at the
tree's ``src`` folders, ahead of the installed editable ones) in fresh interpreters, alternating the trees round
by round so drift hits both alike, and reports the median, min and max per tree and device.

Fused devices record ``a + b`` lazily; the probe reads a result back after every timed loop, so the pending work
of the last iteration is realized and recording overhead is what is measured (dead intermediates are never
computed, on purpose: that is fusion's behaviour).

Usage::

    git worktree add /tmp/base <old-commit>
    python benchmarks/compare_overhead.py --base /tmp/base [--new .] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

DEVICES = ("flex", "flex+fusion", "flex+autodiff")

_PROBE = r"""
import json, sys, time
import numpy as np
import ember

res = {}
number, repeats = int(sys.argv[1]), int(sys.argv[2])
for spec in sys.argv[3:]:
    dev = ember.Device.parse(spec)
    rng = np.random.default_rng(0)
    a = ember.tensor(rng.standard_normal(1000).astype(np.float32), device=dev)
    b = ember.tensor(rng.standard_normal(1000).astype(np.float32), device=dev)
    for _ in range(2000):
        c = a + b
    c.numpy()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            c = a + b
        samples.append((time.perf_counter() - t0) / number * 1e6)
        c.numpy()  # the last pending result is computed, outside the timed loop
    res[spec] = sorted(samples)[len(samples) // 2]
print(json.dumps(res))
"""


def source_path(root: Path) -> str:
    """The ``src`` folders of every package and plugin in the checkout at root, as a PYTHONPATH."""
    folders = sorted(str(p) for p in root.glob("packages/*/src")) + sorted(str(p) for p in root.glob("plugins/*/*/src"))
    folders += [str(p) for p in root.glob("tests/example-backend/src")]
    return os.pathsep.join(folders)


def probe(root: Path, devices: tuple[str, ...], number: int, repeats: int) -> dict[str, float]:
    """Median per-op microseconds of a + b per device, in a fresh interpreter on root's sources."""
    env = dict(os.environ, PYTHONPATH=source_path(root))
    cmd = [sys.executable, "-c", _PROBE, str(number), str(repeats), *devices]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the old checkout (e.g. a git worktree)")
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1], help="the new checkout")
    parser.add_argument("--rounds", type=int, default=5, help="fresh interpreters per tree (default 5)")
    parser.add_argument("--number", type=int, default=20000, help="calls per timed loop (default 20000)")
    parser.add_argument("--repeats", type=int, default=15, help="timed loops per interpreter (default 15)")
    args = parser.parse_args(argv)
    trees = {"before": args.base.resolve(), "after": args.new.resolve()}
    samples: dict[str, dict[str, list[float]]] = {t: {d: [] for d in DEVICES} for t in trees}
    for _ in range(args.rounds):
        for name, root in trees.items():
            for dev, us in probe(root, DEVICES, args.number, args.repeats).items():
                samples[name][dev].append(us)
    print(f"a + b, 1,000 float32: per-op microseconds, median of {args.rounds} interpreters per tree "
          f"(each the median of {args.repeats} x {args.number} calls), alternating trees")
    print(f"  {'device':<22}{'before':>10}{'after':>10}{'after/before':>14}   before min-max / after min-max")
    for dev in DEVICES:
        b, a = samples["before"][dev], samples["after"][dev]
        mb, ma = statistics.median(b), statistics.median(a)
        spread = f"{min(b):.2f}-{max(b):.2f} / {min(a):.2f}-{max(a):.2f}"
        print(f"  {dev:<22}{mb:>10.2f}{ma:>10.2f}{ma / mb:>14.2f}   {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
