"""Figures for the remote and router guides: seed-CNN training through ``remote`` (an ``ember serve`` subprocess on
loopback) and through ``router(local)``, against local flex: bytes, round trips and graph counters per step (first,
second, steady), steps/s, with and without compression, TLS and plaintext.

Run from the source checkout: ``python plugins/backends/ember-remote/benchmarks/remote_figures.py [--batch 8]
[--steps 12]``. Prints one JSON object per configuration, then Markdown tables. The configurations take their steps
in turn (step 1 of each, then step 2 of each, ...), so a change in the machine's load hits them alike; besides
wall-clock steps/s the tables give CPU seconds per step (this process, plus the server process for remote: read
from ``/proc``), which a loaded machine changes much less. The byte and message counts do not vary at all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import ember
import ember.nn.functional as F
from ember import Device
from ember_remote.kit import start_server, stop_server
from ember_remote.server import fingerprint_of, write_self_signed
from ember_train import models

_REMOTE = ("bytes_sent", "bytes_received", "round_trips", "graphs_registered", "replays", "ops_sent", "calls",
           "uploads", "downloads")
_ROUTER = ("graphs_registered", "replays", "ops_sent", "messages", "bytes_sent", "calls", "uploads", "downloads")


def _cpu_of(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` from /proc (0.0 where there is none); None: this process."""
    if pid is None:
        return time.process_time()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def trainer(dev: Device, batch: int, counters: Callable[[], dict[str, int]] | None,
            server_pid: int | None, out: dict[str, Any], before_step: Callable[[], None] | None = None
            ) -> Iterator[None]:
    """SGD steps of the seed CNN on ``dev`` (one loss read per step), one per ``next()``; fills ``out`` with the
    losses, per-step counter deltas, wall-clock times and CPU seconds (this process and the server's)."""
    ember.manual_seed(0)
    m = models.seed_cnn(dropout=0.0).to(dev)
    opt = ember.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    out.update(losses=[], deltas=[], times=[], cpu=[])
    while True:
        if before_step is not None:
            before_step()
        before = counters() if counters else {}
        cpu0 = _cpu_of(None) + (_cpu_of(server_pid) if server_pid else 0.0)
        t = time.perf_counter()
        x = ember.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), device=dev)
        y = ember.tensor(rng.integers(0, 10, batch), device=dev)
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        out["losses"].append(loss.item())
        out["times"].append(time.perf_counter() - t)
        out["cpu"].append(_cpu_of(None) + (_cpu_of(server_pid) if server_pid else 0.0) - cpu0)
        after = counters() if counters else {}
        out["deltas"].append({k: after[k] - before[k] for k in after})
        yield


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    results: dict[str, dict[str, Any]] = {}
    steps: list[Iterator[None]] = []

    def add(name: str, dev: Device, counters: Callable[[], dict[str, int]] | None, pid: int | None = None,
            before_step: Callable[[], None] | None = None) -> None:
        results[name] = {}
        steps.append(trainer(dev, args.batch, counters, pid, results[name], before_step))

    add("flex+autodiff (local)", Device.parse("flex+autodiff"), None)
    router = Device.parse("flex+autodiff+router(local)")
    add("flex+autodiff+router(local)", router, lambda: {k: router.stack.counts[k] for k in _ROUTER})

    with tempfile.TemporaryDirectory(prefix="ember-remote-figures-") as tmp:
        d = Path(tmp)
        pki = write_self_signed(d / "pki")
        procs = []
        try:
            for tls in (False, True):
                (d / ("tls" if tls else "plain")).mkdir()
                proc, port, token = start_server(d / ("tls" if tls else "plain"), ["flex"],
                                                 tls=(pki["cert"], pki["key"]) if tls else None)
                procs.append(proc)
                for compress in (False, True):
                    opts: dict[str, Any] = {"token": token, "compress": compress}
                    if tls:
                        opts["fingerprint"] = fingerprint_of(pki["cert"])
                    else:
                        opts["insecure"] = True
                    rdev = Device.remote(f"ember://127.0.0.1:{port}/flex", **opts)
                    name = f"remote ({'TLS' if tls else 'plaintext'}, {'zlib' if compress else 'no compression'})"
                    add(name, rdev.autodiff(), lambda b=rdev.stack: {k: b.counts[k] for k in _REMOTE}, proc.pid)
                if not tls:
                    # without graph replay: the client forgets its graphs before every step, so each step registers
                    # every graph again (the server keeps the old ones: within its limit for these few steps)
                    rdev = Device.remote(f"ember://127.0.0.1:{port}/flex", token=token, insecure=True, timeout=299.0)
                    add("remote (plaintext, no graph replay)", rdev.autodiff(),
                        lambda b=rdev.stack: {k: b.counts[k] for k in _REMOTE}, proc.pid,
                        lambda b=rdev.stack: b._graphs.clear())
            for _ in range(args.steps):
                for step in steps:  # in turn: load changes hit every configuration alike
                    next(step)
        finally:
            for proc in procs:
                stop_server(proc)

    for r in results.values():
        steady = r["times"][3:] or r["times"][-1:]
        r["first_step_s"] = r["times"][0]
        r["steady_steps_per_s"] = 1.0 / statistics.median(steady)
        r["first_step_cpu_s"] = r["cpu"][0]
        r["steady_cpu_s_per_step"] = statistics.median(r["cpu"][3:] or r["cpu"][-1:])
    local = results["flex+autodiff (local)"]["losses"]
    for name, r in results.items():
        r["losses_equal_local"] = [np.float32(a).tobytes() for a in r["losses"]] == [
            np.float32(b).tobytes() for b in local]
        print(json.dumps({"config": name, **{k: v for k, v in r.items() if k not in ("losses", "times", "cpu")}}))
    for keys in (_ROUTER, _REMOTE):
        print("\n| configuration | step | " + " | ".join(keys) + " |")
        for name, r in results.items():
            if r["deltas"] and set(r["deltas"][0]) == set(keys):
                for label, i in (("1", 0), ("2", 1), ("3+", 3)):
                    print(f"| {name} | {label} | " + " | ".join(f"{r['deltas'][i][k]:,}" for k in keys) + " |")
    print("\n| configuration | first step (s) | steady steps/s | CPU s, first step | CPU s per steady step "
          "| losses equal local |")
    for name, r in results.items():
        print(f"| {name} | {r['first_step_s']:.3f} | {r['steady_steps_per_s']:.1f} | {r['first_step_cpu_s']:.3f} "
              f"| {r['steady_cpu_s_per_step']:.3f} | {r['losses_equal_local']} |")


if __name__ == "__main__":
    main()
