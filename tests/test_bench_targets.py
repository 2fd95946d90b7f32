"""The target table of ``ember bench`` (benchmarks/targets.py): which figures each target reads and how it judges
them, on hand-made figures (no timing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
pytestmark = pytest.mark.skipif(not (BENCH / "targets.py").is_file(), reason="benchmarks/ is not in this checkout")


@pytest.fixture(scope="module")
def targets():
    sys.path.insert(0, str(BENCH))
    try:
        import targets as mod
    finally:
        sys.path.remove(str(BENCH))
    return mod


def _rows(targets, figures, memory=()):
    return {(r["target"], r["figure"]): r for r in targets.evaluate(figures, memory)}


def test_ratios_to_torch_are_met_at_or_below_the_bound(targets) -> None:
    figs = [{"section": "cnn", "name": "cnn train step, batch 64 (Adam)", "ratio_ember_torch": 1.0},
            {"section": "cnn", "name": "cnn train step, batch 256 (Adam)", "ratio_ember_torch": 1.34},
            # the compiled row of the same section is not the eager target's figure
            {"section": "cnn", "name": "cnn train step, batch 64 (Adam), ember.compile", "ratio_ember_torch": 0.5}]
    rows = _rows(targets, figs)
    assert rows[("seed-CNN training step, flex (eager)", "cnn train step, batch 64 (Adam)")]["met"] is True
    assert rows[("seed-CNN training step, flex (eager)", "cnn train step, batch 256 (Adam)")]["met"] is False
    assert not any("ember.compile" in (f or "") for _, f in rows)


def test_speedups_are_met_at_or_above_the_bound_per_backend(targets) -> None:
    figs = [{"section": "replay", "name": "seed-CNN step, batch 16, flex: replayed vs eager", "backend": "flex",
             "speedup": 1.5},
            {"section": "replay", "name": "seed-CNN step, batch 16, opencl: replayed vs eager", "backend": "opencl",
             "speedup": 1.49},
            {"section": "fused chain", "name": "GELU", "backend": "opencl", "speedup_fused": 2.9}]
    rows = _rows(targets, figs)
    assert rows[("replayed vs eager step, flex", figs[0]["name"])]["met"] is True
    assert rows[("replayed vs eager step, OpenCL", figs[1]["name"])]["met"] is False
    assert rows[("GELU chain fused vs unfused, OpenCL", "GELU")]["met"] is False  # the bound there is 3x


def test_a_target_without_figures_is_reported_as_not_run(targets) -> None:
    rows = targets.evaluate([], [{"name": "cnn train step, batch 64, peak RSS growth", "ratio_ember_torch": 0.7}])
    assert len(rows) == len(targets.TARGETS)
    by_target = {r["target"]: r for r in rows}
    assert by_target["seed-CNN step peak RSS growth, flex"]["met"] is True
    assert by_target["full seed transformer inference, flex"]["value"] is None
    text = targets.format_targets(rows)
    assert "not run" in text and "met" in text


def test_a_figure_without_its_value_does_not_count(targets) -> None:
    """A ratio is None when torch is not installed: the target is then not run, never judged on a missing value."""
    rows = targets.evaluate([{"section": "per-op", "name": "a + b, 1k f32", "ratio_ember_torch": None}])
    row = next(r for r in rows if r["target"] == "Tensor a + b, 1,000 f32, flex")
    assert row["value"] is None and row["met"] is None
