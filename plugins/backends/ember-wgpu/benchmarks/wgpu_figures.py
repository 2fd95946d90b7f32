"""Figures for ember-wgpu's guide: seed-CNN training step on wgpu vs flex vs torch (same run), a+b launch cost,
and cold vs warm time to the first seed-CNN step (each in a fresh interpreter).

Run from the source checkout: ``python plugins/backends/ember-wgpu/benchmarks/wgpu_figures.py [--batch 16]``.
It uses the repository's ``benchmarks/suite.py`` for the seed CNN, its weights and batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _median_ms(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def cnn_steps(batch: int, repeats: int) -> dict[str, float]:
    from suite import ember_train_step, torch_train_step

    from ember import Device

    wgpu_dev = Device.wgpu(0).autodiff()
    steps = {"wgpu": ember_train_step("cnn", batch, wgpu_dev),
             "flex": ember_train_step("cnn", batch, Device.flex().autodiff()),
             "torch": torch_train_step("cnn", batch)}
    out = {}
    for name, step in steps.items():
        def run(step=step, name=name) -> None:
            step()
            if name == "wgpu":
                wgpu_dev.sync()
        out[name] = _median_ms(run, repeats)
    return out


def launch_cost(repeats: int = 200) -> dict[str, float]:
    import numpy as np

    import ember
    from ember import Device

    dev = Device.wgpu(0)
    a = ember.tensor(np.ones(1000, np.float32), device=dev)
    b = ember.tensor(np.ones(1000, np.float32), device=dev)
    (a + b).numpy()
    t = time.perf_counter()
    for _ in range(repeats):
        a + b
    dev.sync()
    async_us = (time.perf_counter() - t) / repeats * 1e6
    t = time.perf_counter()
    for _ in range(repeats // 4):
        (a + b).numpy()
    roundtrip_us = (time.perf_counter() - t) / (repeats // 4) * 1e6
    return {"a+b_enqueue_us": async_us, "a+b_with_readback_us": roundtrip_us}


def first_step_child(batch: int) -> None:
    t0 = time.perf_counter()
    from suite import ember_train_step

    from ember import Device

    dev = Device.wgpu(0).autodiff()
    step = ember_train_step("cnn", batch, dev)
    step()
    dev.sync()
    print(json.dumps({"first_step_s": time.perf_counter() - t0}))


def cold_warm(batch: int) -> dict[str, float]:
    """Time to the first seed-CNN step in fresh interpreters. The shader cache is per process, so "cold" and
    "warm" differ only by the OS/driver caches (lavapipe keeps no disk cache): the second run shows that part."""
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, __file__, "--child", "--batch", str(batch)], capture_output=True,
                           text=True, check=True)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1])["first_step_s"])
    return {"first_run_s": runs[0], "second_run_s": runs[1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--child", action="store_true")
    args = p.parse_args()
    if args.child:
        first_step_child(args.batch)
        return
    figures = {"batch": args.batch, **launch_cost(), "cnn_step_ms": cnn_steps(args.batch, args.repeats),
               "first_step": cold_warm(args.batch)}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
