"""Figures for the remote and router guides: seed-CNN training through ``remote`` (an ``ember serve`` subprocess on
loopback) and through ``router(local)``, against local flex: bytes, round trips and graph counters per step (first,
second, steady), steps/s, with and without compression, TLS and plaintext.

Run from the source checkout: ``python plugins/backends/ember-remote/benchmarks/remote_figures.py [--batch 8]
[--steps 12]``. Prints one JSON object per configuration, then a Markdown table. Timings on a shared machine vary
from run to run; the byte and message counts do not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
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


def train(dev: Device, batch: int, steps: int, counters: Callable[[], dict[str, int]] | None) -> dict[str, Any]:
    """``steps`` SGD steps of the seed CNN on ``dev`` (one loss read per step); per-step counter deltas and times."""
    ember.manual_seed(0)
    m = models.seed_cnn(dropout=0.0).to(dev)
    opt = ember.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    deltas, times, losses = [], [], []
    for _ in range(steps):
        before = counters() if counters else {}
        t = time.perf_counter()
        x = ember.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), device=dev)
        y = ember.tensor(rng.integers(0, 10, batch), device=dev)
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t)
        after = counters() if counters else {}
        deltas.append({k: after[k] - before[k] for k in after})
    steady = times[3:] or times[-1:]
    return {"losses": losses, "deltas": deltas, "first_step_s": times[0],
            "steady_steps_per_s": 1.0 / statistics.median(steady)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    results: dict[str, dict[str, Any]] = {}

    results["flex+autodiff (local)"] = train(Device.parse("flex+autodiff"), args.batch, args.steps, None)

    router = Device.parse("flex+autodiff+router(local)")

    def router_counts() -> dict[str, int]:
        rep = router.stack.counts
        return {k: rep[k] for k in _ROUTER}

    results["flex+autodiff+router(local)"] = train(router, args.batch, args.steps, router_counts)

    with tempfile.TemporaryDirectory(prefix="ember-remote-figures-") as tmp:
        d = Path(tmp)
        pki = write_self_signed(d / "pki")
        for tls in (False, True):
            proc, port, token = start_server(d, ["flex"], tls=(pki["cert"], pki["key"]) if tls else None)
            try:
                for compress in (False, True):
                    opts: dict[str, Any] = {"token": token, "compress": compress}
                    if tls:
                        opts["fingerprint"] = fingerprint_of(pki["cert"])
                    else:
                        opts["insecure"] = True
                    rdev = Device.remote(f"ember://127.0.0.1:{port}/flex", **opts)
                    backend = rdev.stack

                    def remote_counts(b: Any = backend) -> dict[str, int]:
                        return {k: b.counts[k] for k in _REMOTE}

                    name = f"remote ({'TLS' if tls else 'plaintext'}, {'zlib' if compress else 'no compression'})"
                    results[name] = train(rdev.autodiff(), args.batch, args.steps, remote_counts)
                    backend.close()
            finally:
                stop_server(proc)

    local = results["flex+autodiff (local)"]["losses"]
    for name, r in results.items():
        r["losses_equal_local"] = [np.float32(a).tobytes() for a in r["losses"]] == [
            np.float32(b).tobytes() for b in local]
        print(json.dumps({"config": name, **{k: v for k, v in r.items() if k != "losses"}}))
    for keys in (_ROUTER, _REMOTE):
        print("\n| configuration | step | " + " | ".join(keys) + " |")
        for name, r in results.items():
            if r["deltas"] and set(r["deltas"][0]) == set(keys):
                for label, i in (("1", 0), ("2", 1), ("3+", 3)):
                    print(f"| {name} | {label} | " + " | ".join(f"{r['deltas'][i][k]:,}" for k in keys) + " |")
    print("\n| configuration | first step (s) | steady steps/s | losses equal local |")
    for name, r in results.items():
        print(f"| {name} | {r['first_step_s']:.3f} | {r['steady_steps_per_s']:.1f} | {r['losses_equal_local']} |")


if __name__ == "__main__":
    main()
