"""Figures for ember-wgpu's guide, all in one run: seed-CNN training step on wgpu vs flex vs torch, a+b launch cost,
fused vs unfused 8-op elementwise chain, cold vs warm time to the first seed-CNN step (fresh interpreters), and
the matmul kernel candidates' times.

Run from the source checkout: ``python plugins/backends/ember-wgpu/benchmarks/wgpu_figures.py [--batch 16]``.
It uses the repository's ``benchmarks/suite.py`` for the seed CNN, its weights and batch.

"Cold" is a fresh interpreter with an empty ember cache directory (no matmul tune results) and an empty Mesa
shader cache; "warm" is the next fresh interpreter with both kept. WebGPU (wgpu-native) exposes no pipeline
cache to serialise, so every process compiles its WGSL again; what a warm start saves is the tuning and whatever
the driver caches on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _median_ms(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def cnn_steps(batch: int, repeats: int) -> dict[str, float]:
    """Median ms of one seed-CNN training step (Adam) per engine, all in this process."""
    from suite import ember_train_step, torch_train_step

    from ember import Device

    steps = {"wgpu": ember_train_step("cnn", batch, Device.wgpu(0).autodiff()),
             "flex": ember_train_step("cnn", batch, Device.flex().autodiff()),
             "torch": torch_train_step("cnn", batch)}
    return {name: _median_ms(step, repeats) for name, step in steps.items()}


def launch_cost(repeats: int = 200) -> dict[str, float]:
    """Microseconds per ``a + b`` on 1000 floats: recorded only (fusion off, so every op is a dispatch), and
    with the read-back of the result."""
    import numpy as np

    import ember
    from ember import Device

    dev = Device.wgpu(0).fusion(False)
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


def chain(repeats: int) -> dict[str, float]:
    """Median ms of the 8-op chain + sum on 1M float32, fused and unfused, on wgpu and on flex."""
    import numpy as np

    import ember
    from ember import Device

    host = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    out = {}
    for name, dev in (("wgpu_fused", Device.wgpu(0)), ("wgpu_unfused", Device.wgpu(0).fusion(False)),
                      ("flex_fused", Device.flex()), ("flex_unfused", Device.flex().fusion(False))):
        x = ember.tensor(host, device=dev)

        def run(x: Any = x) -> float:
            return float(((((x * 2 + 1).sin() * x - 3).abs().sqrt() + x).tanh() * 0.5).sum().item())

        out[name] = _median_ms(run, repeats)
    return out


def matmul_candidates() -> dict[str, dict[str, float]]:
    """ms per float32 product for every matmul candidate (what the autotuner compares)."""
    import numpy as np

    import ember
    from ember_wgpu import array as arr
    from ember_wgpu import matmul as mm
    from ember_wgpu.runtime import runtime

    rt = runtime(0)
    rng = np.random.default_rng(0)
    res = {}
    for M, K, N in ((128, 128, 128), (512, 512, 512), (64, 1600, 800)):
        a = arr.upload(rt, rng.standard_normal((M, K)).astype(np.float32), ember.float32)
        b = arr.upload(rt, rng.standard_normal((K, N)).astype(np.float32), ember.float32)
        out = arr.empty(rt, (M, N), ember.float32)
        run = mm._timer(a, b, out)
        res[f"{M}x{K}x{N}"] = {json.dumps(c, sort_keys=True): round(run(c) * 1e3, 1) for c in mm.CANDIDATES}
    return res


def first_step_child(batch: int) -> None:
    t0 = time.perf_counter()
    from suite import ember_train_step

    from ember import Device

    dev = Device.wgpu(0).autodiff()
    t_import = time.perf_counter() - t0
    step = ember_train_step("cnn", batch, dev)
    step()
    dev.sync()
    stats = dict(dev.stack.base_backend.rt.stats)
    print(json.dumps({"first_step_s": time.perf_counter() - t0, "imports_and_device_s": t_import,
                      "pipelines": stats["pipelines"], "compile_s": stats["compile_seconds"]}))


def cold_warm(batch: int) -> dict[str, Any]:
    """Time to the first seed-CNN step in two fresh interpreters sharing fresh cache directories."""
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, EMBER_CACHE_DIR=cache, MESA_SHADER_CACHE_DIR=os.path.join(cache, "mesa"))
        for _ in range(2):
            r = subprocess.run([sys.executable, __file__, "--child", "--batch", str(batch)], capture_output=True,
                               text=True, check=True, env=env)
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {"cold": runs[0], "warm": runs[1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--child", action="store_true")
    args = p.parse_args()
    if args.child:
        first_step_child(args.batch)
        return
    figures = {"batch": args.batch, "first_step": cold_warm(args.batch), **launch_cost(),
               "chain_ms": chain(args.repeats), "cnn_step_ms": cnn_steps(args.batch, args.repeats),
               "matmul_candidates_ms": matmul_candidates()}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
