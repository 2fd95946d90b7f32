"""``python -m ember_distributed.bench``: DDP training throughput of the seed CNN (or an MLP) on the ranks it runs on.

Run it with 1 and with N ranks (``ember launch -n 2 -- python -m ember_distributed.bench``) at the same global
batch. Rank 0 prints one JSON line: global steps/s, the gradient bytes all-reduced per step (per rank), the bucket
sizes, and the overlap fraction ``1 - exposed / blocking``: ``exposed`` is the time the last gradient hook waits
for the in-flight all-reduces minus the time it waits for the slowest rank to finish its backward (the ranks'
``time.monotonic()`` instants compared, so on one host), i.e. communication backward did not hide; ``blocking`` is
the time the same bucket all-reduces take issued back to back with nothing to overlap. Medians over the steps.
Needs ember-train for the seed CNN.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import numpy as np

import ember
from ember import nn

from .collectives import all_gather_object, barrier
from .ddp import DistributedDataParallel
from .group import ReduceOp, get_rank, get_world_size, init


def _model(kind: str) -> tuple[nn.Module, tuple[int, ...]]:
    if kind == "seed-cnn":
        from ember_train.models import seed_cnn

        return seed_cnn(dropout=0.0), (1, 28, 28)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)), (256,)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the JSON line (rank 0)."""
    p = argparse.ArgumentParser(prog="python -m ember_distributed.bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["seed-cnn", "mlp"], default="seed-cnn")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--device", default="flex")
    a = p.parse_args(argv)
    init("mpi")
    world, rank = get_world_size(), get_rank()
    ember.manual_seed(0)
    dev = ember.Device.parse(a.device).autodiff()
    model, shape = _model(a.model)
    model = model.to(dev)
    ddp = DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    opt = ember.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    local = a.global_batch // world
    rng = np.random.default_rng(rank)
    x = ember.tensor(rng.standard_normal((local, *shape)).astype(np.float32), device=dev)
    y = ember.tensor(rng.integers(0, 10, local), device=dev)
    exposed, waits, spans = [], [], []
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        lossf(ddp(x), y).backward()
        opt.step()
        st = ddp.last_step_stats()
        if s >= a.warmup and st:
            waits.append(st)
            spans.append(st["backward_span_s"])
    barrier()
    elapsed = time.perf_counter() - t0
    for st in waits:  # after the timed loop: the exchange of instants must not slow the steps
        ready: list = [None] * world
        all_gather_object(ready, st["ready_at"])
        skew = max(ready) - st["ready_at"]  # waiting for the slowest rank's backward, not communication
        exposed.append(max(0.0, st["exposed_wait_s"] - skew))
    # the same bucket all-reduces, back to back with nothing to overlap them with
    blocking = []
    bufs = [np.zeros(n // 4, dtype=np.float32) for n in ddp.bucket_sizes()]
    g = ddp.process_group
    for _ in range(a.steps if world > 1 else 0):
        barrier()
        t1 = time.perf_counter()
        for b in bufs:
            g.wait(g.engine.all_reduce(b, ReduceOp.SUM), "bench all_reduce")
        blocking.append(time.perf_counter() - t1)
    out = {
        "model": a.model, "ranks": world, "global_batch": local * world, "steps_per_s": a.steps / elapsed,
        "bytes_all_reduced_per_step": int(sum(ddp.bucket_sizes())) if world > 1 else 0,
        "buckets_bytes": ddp.bucket_sizes(),
        "wait_ms": 1e3 * float(np.median([st["exposed_wait_s"] for st in waits])) if waits else 0.0,
        "exposed_wait_ms": 1e3 * float(np.median(exposed)) if exposed else 0.0,
        "blocking_all_reduce_ms": 1e3 * float(np.median(blocking)) if blocking else 0.0,
        "backward_span_ms": 1e3 * float(np.median(spans)) if spans else 0.0,
    }
    if blocking:
        out["overlap_fraction"] = max(0.0, 1.0 - out["exposed_wait_ms"] / out["blocking_all_reduce_ms"])
    if rank == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
