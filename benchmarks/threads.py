"""flex's thread pool by size: elementwise ops and reductions on 1e2..1e7 float32, flex against PyTorch.

For every thread count asked for (default: 1 and every CPU this process may use), ``ember.set_num_threads(t)`` and
``torch.set_num_threads(t)`` are set alike, and six ops are timed on each size, flex and torch alternating inside
every repeat (medians; --json adds min/max/IQR): ``a + b``, ``exp(a)``, ``a.sum()``, ``a.sum(dim=-1)`` (rows of 1,000
elements; one row below 1,000), ``a.amax()`` and ``a.clone()``. Every result is realized in the timed loop (an
ember device is synced with the result alive), so a lazily recording device computes what it is timed on. The last
column compares flex at t threads with flex at 1 thread from the same run: what the pool
(:mod:`ember_flex.threads`) buys.

On a loaded machine (other processes on the cores) threads cannot help and the figures say so; compare the
1-thread and t-thread columns from one run only. Under each op, "pool (pooled / cold)" counts flex's ops that ran
on the pool and the large ones it ran serially because its pooled ops had stopped paying (``pool_stats`` of
:mod:`ember_flex.threads`): a t-thread column with many cold ops measured a busy machine, not the pool. The pool
judges each kind of op on its own (an add, an exp, a sum); "kinds" lists the ones that op measured, with their
speed-up estimates at the end of the op's sizes (``kind_stats``).

Usage::

    python benchmarks/threads.py                          # 1 and all CPUs, 1e2..1e7 (about a minute)
    python benchmarks/threads.py --quick                  # fewer repeats, up to 1e6
    python benchmarks/threads.py --threads 1 2 4 8 --json out.json
    ember bench threads [--quick] [--json PATH]           # the same, through the CLI
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench threads` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

import _common  # noqa: E402
from _common import describe_environment, environment, stats, write_json  # noqa: E402

SIZES = [10**k for k in range(2, 8)]
OPS = ["a+b", "exp", "sum", "sum(dim=-1)", "amax", "clone"]
ROW = 1000  # elements per row of sum(dim=-1)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _number(n: int) -> int:
    """Calls per timed sample: about 0.3 M elements' worth, at least one."""
    return max(1, min(2000, 300_000 // n))


def _cases(op: str, n: int, dev: Any) -> dict[str, Callable[[], Any]]:
    import numpy as np

    import ember

    rng = np.random.default_rng(n)
    a_np = rng.standard_normal(n, dtype=np.float32)
    b_np = rng.standard_normal(n, dtype=np.float32)
    rows = a_np.reshape(max(1, n // ROW), -1)
    a, b, r = (ember.tensor(x, device=dev) for x in (a_np, b_np, rows))
    em: dict[str, Callable[[], Any]] = {
        "a+b": lambda: a + b, "exp": lambda: a.exp(), "sum": lambda: a.sum(), "sum(dim=-1)": lambda: r.sum(dim=-1),
        "amax": lambda: a.amax(), "clone": lambda: a.clone(),
    }
    cases = {"flex": em[op]}
    try:
        import torch
    except ImportError:
        return cases
    at, bt, rt = (torch.from_numpy(x.copy()) for x in (a_np, b_np, rows))
    th: dict[str, Callable[[], Any]] = {
        "a+b": lambda: at + bt, "exp": lambda: at.exp(), "sum": lambda: at.sum(), "sum(dim=-1)": lambda: rt.sum(dim=-1),
        "amax": lambda: at.amax(), "clone": lambda: at.clone(),
    }
    cases["torch"] = th[op]
    # the thing timed computes the right answer
    np.testing.assert_allclose(np.asarray(cases["flex"]().numpy(), dtype=np.float64),
                               th[op]().numpy().astype(np.float64), rtol=1e-4, atol=1e-3 * max(1.0, n ** 0.5))
    return cases


def _pool_stats(reset: bool = False) -> dict[str, Any] | None:
    """flex's pool counters (ops pooled, large ops run serially while the pool was cold) and, where the pool keeps
    them, {"kinds": {kind: its speed-up estimate}} for the kinds that ran since the last reset; None without."""
    try:
        from ember_flex import threads as flex_threads
    except ImportError:
        return None
    if not hasattr(flex_threads, "pool_stats"):
        return None
    r: dict[str, Any] = dict(flex_threads.pool_stats(reset))
    if hasattr(flex_threads, "kind_stats"):
        r["kinds"] = {k: v["gain"] for k, v in flex_threads.kind_stats(reset).items() if v["pooled"] or v["serial"]}
    return r


def run(threads: Sequence[int], sizes: Sequence[int], repeats: int,
        pool: dict[str, Any] | None = None) -> dict[str, Any]:
    """{thread count: {op: {size: {case: stats (seconds)}}}}, every case alternating with the others; ``pool``
    (when given) gets {thread count: {op: flex's pool counters over that op's sizes}}."""
    import ember

    dev = ember.Device.flex()
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for t in threads:
        ember.set_num_threads(t)
        if torch is not None:
            torch.set_num_threads(t)
        per_op: dict[str, Any] = {}
        for op in OPS:
            per_size: dict[str, Any] = {}
            _pool_stats(reset=True)
            for n in sizes:
                cases = _cases(op, n, dev)
                number = _number(n)
                # small sizes: one device sync per PER_OP_HOLD results kept alive (as overhead.py), not per call
                samples = _common.sample_cases(cases, repeats, number, warmup=max(1, min(number, 20)),
                                               hold=min(number, _common.PER_OP_HOLD))
                per_size[str(n)] = {name: stats(s) for name, s in samples.items()}
            per_op[op] = per_size
            counters = _pool_stats()
            if pool is not None and counters is not None:
                pool.setdefault(str(t), {})[op] = counters
        out[str(t)] = per_op
    return out


def report(res: dict[str, Any], repeats: int, pool: dict[str, Any] | None = None) -> str:
    threads = list(res)
    lines = [f"per-call time in microseconds, median of {repeats} alternating repeats (--json: spread); "
             "ratio = flex / torch at the same thread count; xT1 = flex at 1 thread / flex at t threads",
             "pool: flex ops run on its thread pool / large ops run serially because the pool was cold (its "
             "pooled ops had stopped paying: other processes on the cores)"]
    for op in OPS:
        lines.append("")
        lines.append(f"{op} (float32)")
        head = f"  {'elements':>10}"
        for t in threads:
            head += f" | t={t:<3}{'flex':>10}{'torch':>10}{'ratio':>7}" + ("" if t == "1" else f"{'xT1':>6}")
        lines.append(head)
        for n in res[threads[0]][op]:
            row = f"  {int(n):>10.0e}"
            base = res.get("1", {}).get(op, {}).get(n, {}).get("flex", {}).get("median")
            for t in threads:
                cell = res[t][op][n]
                fl = cell["flex"]["median"]
                to = cell.get("torch", {}).get("median")
                row += f" |      {fl * 1e6:10.1f}" + (f"{to * 1e6:10.1f}{fl / to:7.2f}" if to else f"{'-':>10}{'-':>7}")
                if t != "1":
                    row += f"{base / fl:6.2f}" if base else f"{'-':>6}"
            lines.append(row)
        counts = [f"t={t}: {pool[t][op]['pooled']} / {pool[t][op]['cold']}" for t in threads
                  if t != "1" and pool and op in pool.get(t, {})]
        if counts:
            lines.append("  pool (pooled / cold): " + ", ".join(counts))
        kinds = [f"t={t}: " + ", ".join(f"{k} {g:.2f}" for k, g in pool[t][op]["kinds"].items()) for t in threads
                 if t != "1" and pool and pool.get(t, {}).get(op, {}).get("kinds")]
        if kinds:
            lines.append("  kinds (speed-up estimate): " + "; ".join(kinds))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="flex's thread pool by size, against PyTorch")
    parser.add_argument("--quick", action="store_true", help="fewer repeats, sizes up to 1e6")
    parser.add_argument("--json", metavar="PATH", help="write results and environment to PATH")
    parser.add_argument("--threads", type=int, nargs="+", metavar="N",
                        help="thread counts to run (default: 1 and every CPU)")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="N", help="element counts (default 1e2..1e7)")
    args = parser.parse_args(argv)

    import ember

    threads = args.threads or sorted({1, _cpus()})
    sizes = args.sizes or (SIZES[:-1] if args.quick else SIZES)
    repeats = 5 if args.quick else 15
    before = ember.get_num_threads()
    env = environment()
    print(describe_environment(env, "flex"))
    try:
        pool: dict[str, Any] = {}
        res = run(threads, sizes, repeats, pool)
    finally:
        ember.set_num_threads(before)
    print(report(res, repeats, pool))
    if args.json:
        write_json(args.json, {"benchmark": "threads", "quick": args.quick, "repeats": repeats,
                               "seconds_per_call": res, "pool": pool, "environment": env})
    return 0


if __name__ == "__main__":
    sys.exit(main())
