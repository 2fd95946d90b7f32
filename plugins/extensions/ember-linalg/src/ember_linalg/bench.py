"""``ember bench linalg``: ember.linalg (ember-linalg on flex) against torch.linalg on the same inputs, same run.

Each row times one function on one shape: ember's forward on flex, torch's forward (CPU), and forward+backward of
``f(A).sum()``-style losses under ember's autodiff and torch autograd. Times are the best of ``--repeat`` runs of a
loop sized to take about ``--min-time`` seconds (the best, not the median: on a shared machine the other loops
measure the neighbours); every ember result is read back (``.numpy()``) inside the loop so
the work is done, not just recorded. ``--json PATH`` writes the rows; ``--quick`` runs two small shapes (the tests use
it). The script ships inside the package, so it runs from an installed wheel too.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

SHAPES_FULL = [(64, 64), (256, 256), (32, 16, 16)]
SHAPES_QUICK = [(8, 8), (4, 4, 4)]


def _spd(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Symmetric positive-definite matrices with eigenvalues of order 1 (so det neither overflows nor underflows)."""
    x = rng.standard_normal(shape)
    return x @ np.swapaxes(x, -1, -2) / (4 * shape[-1]) + np.eye(shape[-1])


# name -> (input builder, forward on a linalg module, loss for backward)
FUNCTIONS: dict[str, tuple[Callable[..., np.ndarray], Callable[[Any, Any], Any], Callable[[Any], Any]]] = {
    "solve": (_spd, lambda L, a: L.solve(a, a[..., :, :1]), lambda out: out.sum()),
    "inv": (_spd, lambda L, a: L.inv(a), lambda out: out.sum()),
    "det": (_spd, lambda L, a: L.det(a), lambda out: out.sum()),
    "cholesky": (_spd, lambda L, a: L.cholesky(a), lambda out: out.sum()),
    "eigh": (_spd, lambda L, a: L.eigh(a)[0], lambda out: out.sum()),
    "svd": (_spd, lambda L, a: L.svd(a, full_matrices=False)[1], lambda out: out.sum()),
    "qr": (_spd, lambda L, a: L.qr(a)[1], lambda out: out.sum()),
}


#: the clock: wall time, or this process's CPU time (``--clock cpu``: with one thread per library it counts the work
#: done and not the time other processes hold the cores, which makes a busy shared machine usable)
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def _time(fn: Callable[[], Any], min_time: float, repeat: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Best seconds per call over ``repeat`` loops, each sized to take about ``min_time``."""
    fn()  # warm-up (kernel registration, caches)
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(min_time / one))
    runs = []
    for _ in range(repeat):
        t0 = clock()
        for _ in range(number):
            fn()
        runs.append((clock() - t0) / number)
    return min(runs)


def _calls(forward: Callable[[Any, Any], Any], loss: Callable[[Any], Any], a: np.ndarray, ea: Any, ta: Any,
           bwd_dev: Any) -> dict[str, Callable[[], Any]]:
    """The four timed calls of one row: ember and torch forward, ember and torch forward+backward."""
    import torch

    import ember

    def ember_fwd() -> Any:
        return forward(ember.linalg, ea).numpy()

    def torch_fwd() -> Any:
        return forward(torch.linalg, ta)

    def ember_bwd() -> Any:
        x = ember.tensor(a, device=bwd_dev, requires_grad=True)
        loss(forward(ember.linalg, x)).backward()
        return x.grad.numpy()

    def torch_bwd() -> Any:
        x = ta.clone().requires_grad_(True)
        loss(forward(torch.linalg, x)).backward()
        return x.grad

    return {"ember": ember_fwd, "torch": torch_fwd, "ember_bwd": ember_bwd, "torch_bwd": torch_bwd}


def run(shapes: Sequence[tuple[int, ...]], names: Sequence[str], min_time: float, repeat: int,
        clock: str = "wall") -> list[dict[str, Any]]:
    """The benchmark rows: one per (function, shape), times in microseconds."""
    import torch

    import ember

    fwd_dev, bwd_dev = ember.device("flex"), ember.device("flex+autodiff")
    rows = []
    for name in names:
        build, forward, loss = FUNCTIONS[name]
        for shape in shapes:
            a = build(np.random.default_rng(0), shape)
            ea, ta = ember.tensor(a, device=fwd_dev), torch.from_numpy(a)

            calls = _calls(forward, loss, a, ea, ta, bwd_dev)
            times = {k: _time(f, min_time, repeat, CLOCKS[clock]) * 1e6 for k, f in calls.items()}
            rows.append({"function": name, "shape": "x".join(map(str, shape)), "dtype": "float64", "clock": clock,
                         "ember_us": times["ember"], "torch_us": times["torch"],
                         "ember_fwd_bwd_us": times["ember_bwd"], "torch_fwd_bwd_us": times["torch_bwd"]})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (forward and forward+backward, ember/torch ratios)."""
    lines = ["| function | shape | ember fwd (us) | torch fwd (us) | ratio | ember fwd+bwd (us) | torch fwd+bwd (us) "
             "| ratio |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['function']} | {r['shape']} | {r['ember_us']:.1f} | {r['torch_us']:.1f} | "
                     f"{r['ember_us'] / r['torch_us']:.2f} | {r['ember_fwd_bwd_us']:.1f} | "
                     f"{r['torch_fwd_bwd_us']:.1f} | {r['ember_fwd_bwd_us'] / r['torch_fwd_bwd_us']:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (``ember bench linalg [--quick] [--json PATH]``)."""
    parser = argparse.ArgumentParser(prog="ember bench linalg", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small shapes, short loops (a smoke run)")
    parser.add_argument("--only", default="", help="comma-separated functions (default: all of "
                                                   f"{', '.join(FUNCTIONS)})")
    parser.add_argument("--min-time", type=float, default=None, help="seconds per timed loop (default 0.05)")
    parser.add_argument("--repeat", type=int, default=None, help="timed loops per row (default 5)")
    parser.add_argument("--json", default="", help="write the rows to this JSON file")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time (default) or process CPU time (for a busy shared machine, with --threads 1)")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS/LAPACK and torch intra-op threads for both libraries (default 1: a like-for-like "
                             "comparison that a busy machine does not distort)")
    args = parser.parse_args(list(argv or []))
    names = [n for n in args.only.split(",") if n] or list(FUNCTIONS)
    unknown = [n for n in names if n not in FUNCTIONS]
    if unknown:
        parser.error(f"unknown function(s) {unknown}; choose from {list(FUNCTIONS)}")
    import torch

    import ember

    torch.set_num_threads(args.threads)
    ember.set_num_threads(args.threads)
    shapes = SHAPES_QUICK if args.quick else SHAPES_FULL
    min_time = args.min_time if args.min_time is not None else (0.002 if args.quick else 0.05)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    rows = run(shapes, names, min_time, repeat, args.clock)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"benchmark": "linalg", "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
