"""Fuzz figures per device, without failing fast: ``python tests/fuzz/report.py --cases 20000``.

Runs about ``--cases`` fuzzed calls per device (spread evenly over the ops of ``fuzz_ops.OPS``; gradient checks on
differentiable devices come on top), each device in its own process so that a crash is recorded rather than
ending the run, and prints a table::

    device                      cases   same  typed allowed    raw  wrong   hang

followed by (``--classes``) the distinct failure classes: op, outcome, what torch and ember did, how many cases,
and one example call. ``--markdown PATH`` writes the same as Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def worker(device: str, per_op: int, only: list[str] | None) -> dict[str, Any]:
    import fuzz_engine as fe
    import fuzz_ops as fo

    reason = fe.unavailable(device)
    if reason:
        return {"device": device, "skipped": reason}
    counts: Counter[str] = Counter()
    classes: dict[str, dict[str, Any]] = {}
    harness: list[str] = []
    for op in fo.OPS:
        if only and op.name not in only:
            continue
        try:
            outcomes = fo.run_op(op, device, per_op)
        except Exception as e:  # a bug of the suite itself: reported, never counted as ember's
            harness.append(f"{op.name}: {type(e).__name__}: {e}")
            continue
        for o in outcomes:
            counts[o.kind] += 1
            if o.failed:
                key = o.class_key
                c = classes.setdefault(key, {"count": 0, "example": o.describe()[:600]})
                c["count"] += 1
    return {"device": device, "counts": dict(counts), "classes": classes, "harness": harness}


def run_device(device: str, per_op: int, only: list[str] | None, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", device, "--per-op", str(per_op)]
    if only:
        cmd += ["--ops", ",".join(only)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"device": device, "crash": f"no result after {timeout:.0f} s (a hang the soft bound missed)"}
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-12:]
        return {"device": device, "crash": f"worker exited {p.returncode}: " + " / ".join(tail)}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["seconds"] = round(time.time() - t0, 1)
    return res


COLUMNS = ("same", "typed", "allowed", "raw", "wrong", "hang")


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'device':<28}{'cases':>7}" + "".join(f"{c:>8}" for c in COLUMNS) + f"{'secs':>7}"]
    for r in results:
        if "skipped" in r:
            lines.append(f"{r['device']:<28} skipped: {r['skipped']}")
            continue
        if "crash" in r:
            lines.append(f"{r['device']:<28} CRASH: {r['crash']}")
            continue
        c = r["counts"]
        lines.append(f"{r['device']:<28}{sum(c.values()):>7}" + "".join(f"{c.get(k, 0):>8}" for k in COLUMNS)
                     + f"{r.get('seconds', 0):>7}")
    return "\n".join(lines)


def classes_text(results: list[dict[str, Any]]) -> str:
    merged: dict[str, dict[str, Any]] = {}
    for r in results:
        for key, c in r.get("classes", {}).items():
            m = merged.setdefault(key, {"count": 0, "devices": [], "example": c["example"]})
            m["count"] += c["count"]
            m["devices"].append(r["device"])
    out = [f"{len(merged)} failure classes (op | outcome | torch | ember: cases, devices)"]
    for key in sorted(merged):
        m = merged[key]
        out.append(f"- {key}: {m['count']} on {', '.join(m['devices'])}\n    e.g. {m['example']}")
    for r in results:
        for h in r.get("harness", []):
            out.append(f"- SUITE ERROR on {r['device']}: {h}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import fuzz_engine as fe

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=int(os.environ.get("EMBER_FUZZ_CASES", "2000")),
                    help="fuzzed calls per device (spread over the ops)")
    ap.add_argument("--devices", default=",".join(fe.DEVICES), help="comma-separated device strings")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: every op in the table)")
    ap.add_argument("--classes", action="store_true", help="also list the distinct failure classes")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per device before it counts as hung")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--per-op", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    only = [s for s in args.ops.split(",") if s] or None
    if args.worker:
        print(json.dumps(worker(args.worker, args.per_op, only)))
        return 0
    import fuzz_ops as fo

    n_ops = len(only) if only else len(fo.OPS)
    per_op = max(1, math.ceil(args.cases / n_ops))
    devices = [d.strip() for d in re.split(r",(?![^()]*\))", args.devices) if d.strip()]
    results = [run_device(d, per_op, only, args.timeout) for d in devices]
    print(f"ember fuzz: {n_ops} ops x {per_op} cases per op per device (+ gradient checks on differentiable "
          "devices); torch " + __import__("torch").__version__)
    print(table(results))
    if args.classes:
        print()
        print(classes_text(results))
    bad = any("crash" in r or any(r.get("counts", {}).get(k) for k in fe.FAILURES) for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
