"""The speed and memory targets of the project's speed work, read off one suite run (``ember bench``).

Each target names the figures it is judged on (by section and fields, so ``--quick``'s smaller batches are found
too) and the value compared: a ratio to PyTorch (ember time / torch time, or peak RSS growth ember / torch), or a
speedup of one ember case over another (unfused / fused, eager / replayed). The table says, per figure, the value,
the target and whether it is met; a target whose figures did not run (a section left out, no OpenCL device) says so.
Nothing here times anything: it only reads the figures the suite's sections produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Figure = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One row of the target table: which figures, what value, and the bound."""

    label: str
    matches: Callable[[Figure], bool]
    value: Callable[[Figure], float | None]
    bound: float
    at_most: bool  # True: value <= bound is met (ratios to torch); False: value >= bound (speedups)
    what: str  # how the value reads, e.g. "x torch" or "x faster"

    def met(self, v: float) -> bool:
        return v <= self.bound if self.at_most else v >= self.bound


def _ratio(fig: Figure) -> float | None:
    return fig.get("ratio_ember_torch")


def _named(section: str, *parts: str) -> Callable[[Figure], bool]:
    return lambda f: f.get("section") == section and all(p in f.get("name", "") for p in parts)


def _backend(section: str, backend: str, *parts: str) -> Callable[[Figure], bool]:
    named = _named(section, *parts)
    return lambda f: named(f) and f.get("backend") == backend


TARGETS: tuple[Target, ...] = (
    Target("seed-CNN training step, flex (eager)", lambda f: f.get("section") == "cnn"
           and f.get("name", "").startswith("cnn train step") and "compile" not in f["name"],
           _ratio, 1.0, True, "x torch"),
    Target("full seed transformer training step, flex", lambda f: f.get("section") == "transformer"
           and f.get("name", "").startswith("transformer-full") and "compile" not in f["name"],
           _ratio, 1.0, True, "x torch"),
    Target("full seed transformer inference, flex", _named("inference", "transformer-full"), _ratio, 1.0, True,
           "x torch"),
    Target("seed-CNN step peak RSS growth, flex", lambda f: f.get("section") == "memory"
           and f.get("name", "").startswith("cnn"), lambda f: f.get("ratio_ember_torch"), 1.0, True, "x torch"),
    Target("replayed vs eager step, flex", _backend("replay", "flex"), lambda f: f.get("speedup"), 1.5, False,
           "x faster"),
    Target("replayed vs eager step, OpenCL", _backend("replay", "opencl"), lambda f: f.get("speedup"), 1.5, False,
           "x faster"),
    Target("fused vs unfused training step, flex", _backend("fused step", "flex"),
           lambda f: f.get("speedup_fused"), 1.3, False, "x faster"),
    Target("fused vs unfused training step, OpenCL", _backend("fused step", "opencl"),
           lambda f: f.get("speedup_fused"), 1.3, False, "x faster"),
    Target("GELU chain fused vs unfused, flex", _backend("fused chain", "flex"),
           lambda f: f.get("speedup_fused"), 2.0, False, "x faster"),
    Target("GELU chain fused vs unfused, OpenCL", _backend("fused chain", "opencl"),
           lambda f: f.get("speedup_fused"), 3.0, False, "x faster"),
    Target("Tensor a + b, 1,000 f32, flex", lambda f: f.get("section") == "per-op"
           and f.get("name") == "a + b, 1k f32", _ratio, 1.0, True, "x torch"),
    Target("a + b recording autodiff, 1,000 f32", lambda f: f.get("section") == "per-op"
           and f.get("name") == "a + b, 1k f32, autodiff", _ratio, 1.5, True, "x torch"),
)


def evaluate(figures: Sequence[Figure], memory: Sequence[Figure] = ()) -> list[dict[str, Any]]:
    """One row per (target, matching figure); a target no figure matched gets one row with ``value`` None."""
    rows: list[dict[str, Any]] = []
    pool = [*figures, *({**m, "section": "memory"} for m in memory)]
    for t in TARGETS:
        hits = [(f, t.value(f)) for f in pool if t.matches(f)]
        hits = [(f, v) for f, v in hits if v is not None]
        if not hits:
            rows.append({"target": t.label, "figure": None, "value": None, "bound": t.bound, "at_most": t.at_most,
                         "what": t.what, "met": None})
        for f, v in hits:
            rows.append({"target": t.label, "figure": f["name"], "value": v, "bound": t.bound,
                         "at_most": t.at_most, "what": t.what, "met": t.met(v)})
    return rows


def format_targets(rows: Sequence[dict[str, Any]]) -> str:
    """The terminal table of :func:`evaluate`'s rows."""
    lines = ["Targets (from the figures above; a ratio to torch is ember time / torch time, a speedup the slower "
             "case's time / the faster one's)"]
    for r in rows:
        bound = f"{'<=' if r['at_most'] else '>='} {r['bound']:g}{r['what'][0]}"
        if r["value"] is None:
            lines.append(f"  {r['target']:<44} {'not run':>10}  target {bound:<8}  -")
            continue
        verdict = "met" if r["met"] else "NOT met"
        lines.append(f"  {r['target']:<44} {r['value']:>9.2f}{r['what'][0]}  target {bound:<8}  {verdict:<7}  "
                     f"({r['figure']})")
    return "\n".join(lines)
