"""Smoke test of the benchmark suite: ``ember bench --quick --json PATH`` runs and reports every section.

No timing is asserted (CI machines are noisy); only that every figure exists, is positive and is self-consistent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "suite.py"


@pytest.mark.skipif(not SUITE.is_file(), reason="benchmarks/suite.py is not in this checkout")
def test_quick_suite_reports_every_section(tmp_path: Path) -> None:
    path = tmp_path / "suite.json"
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_DISABLE_PLUGINS")}
    out = subprocess.run([sys.executable, "-m", "ember.cli", "bench", "--quick", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ember bench suite" in out.stdout and "ember/torch" in out.stdout
    result = json.loads(path.read_text())
    assert result["benchmark"] == "suite" and result["quick"] is True
    assert result["sections"] == ["cnn", "transformer", "inference", "micro", "memory", "speedups"]
    sections = {f["section"] for f in result["figures"]}
    assert sections >= {"cnn", "transformer", "inference", "per-op", "matmul", "conv2d", "elementwise", "reduction",
                        "copy", "replay", "fused step", "fused chain"}
    # the target table: every target has a row; on flex each of these ran (quick skips only the full transformer)
    ran = {r["target"] for r in result["targets"] if r["value"] is not None}
    assert {"replayed vs eager step, flex", "fused vs unfused training step, flex",
            "GELU chain fused vs unfused, flex", "Tensor a + b, 1,000 f32, flex",
            "seed-CNN training step, flex (eager)", "seed-CNN step peak RSS growth, flex"} <= ran
    assert all(r["met"] == (r["value"] <= r["bound"] if r["at_most"] else r["value"] >= r["bound"])
               for r in result["targets"] if r["value"] is not None)
    assert "Targets (from the figures above" in out.stdout
    has_torch = result["environment"]["torch"] is not None
    for fig in result["figures"]:
        assert fig["ember_case"] in fig["seconds"], fig["name"]
        for stats in fig["seconds"].values():
            assert 0 < stats["min"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["max"], fig["name"]
        if has_torch:
            assert fig["ratio_ember_torch"] == pytest.approx(
                fig["seconds"][fig["ember_case"]]["median"] / fig["seconds"][fig["torch_case"]]["median"])
    names = [f["name"] for f in result["figures"]]
    assert any("autodiff" in n for n in names if n.startswith("a * b"))  # with and without autodiff
    assert all(f.get("pct_of_numpy", 0) > 0 for f in result["figures"] if f["section"] == "matmul")
    assert [m["name"].split()[0] for m in result["memory"]] == ["cnn", "transformer-small"]
    for m in result["memory"]:
        assert m["bytes"]["ember"] is None or m["bytes"]["ember"] >= 0
    assert result["environment"]["cpu"] and result["environment"]["numpy"]


def test_compare_overhead_runs_two_checkouts() -> None:
    """benchmarks/compare_overhead.py: the same checkout as both trees, tiny loops; one row per device with a ratio."""
    script = ROOT / "benchmarks" / "compare_overhead.py"
    out = subprocess.run([sys.executable, str(script), "--base", str(ROOT), "--new", str(ROOT), "--rounds", "1",
                          "--number", "200", "--repeats", "3"], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("flex")]
    assert [r[0] for r in rows] == ["flex", "flex+fusion", "flex+autodiff"], out
    for r in rows:
        before, after, ratio = float(r[1]), float(r[2]), float(r[3])
        assert before > 0 and after > 0 and abs(ratio - after / before) < 0.01, out
