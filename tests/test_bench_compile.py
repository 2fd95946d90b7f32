"""Smoke test of the whole-step replay benchmark: ``ember bench compile --quick --json PATH`` runs both sections on
flex, its figures are self-consistent, the replayed step really replayed, and eager and replayed losses agree bit
for bit. No timing is asserted (CI machines are noisy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "compile.py"


def test_compile_benchmark_quick(tmp_path: Path) -> None:
    if not SCRIPT.is_file():
        pytest.skip("benchmarks/ is not in this checkout")
    out = tmp_path / "compile.json"
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_REPLAY", "EMBER_FUSION")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["benchmark"] == "compile" and result["backends"] == ["flex"]
    [fig] = result["figures"]
    assert fig["backend"] == "flex" and fig["identical"] and fig["max_rel_diff"] == 0.0
    for case in ("flex eager", "flex replay"):
        s = fig["seconds"][case]
        assert 0 < s["min"] <= s["median"] <= s["max"], case
    assert fig["speedup"] > 0 and fig["target"] == 1.5
    stats = fig["stats"]
    assert stats["replays"] >= 5 and stats["graph_breaks"] == 0 and stats["records"] > 100
    prof = result["profile"]["flex"]
    for label in ("eager", "replay"):
        p = prof[label]
        assert p["total_ms"] > 0 and 0 < p["kernels_ms"] <= p["total_ms"], label
    assert 0 <= prof["eager"]["compile_python_ms"] < prof["replay"]["compile_python_ms"]  # eager: bindings only
    assert "replayed vs eager" in proc.stdout and "where the time goes" in proc.stdout


def test_compile_benchmark_memory_probe() -> None:
    """The memory section's probe (one fresh interpreter: a few compiled steps of the seed-CNN at batch 2) reports
    its peak and held figures and replayed without a break."""
    if not SCRIPT.is_file():
        pytest.skip("benchmarks/ is not in this checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_REPLAY", "EMBER_FUSION")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--memory-probe", "cnn", "2", "compiled", "rss"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["peak"] >= 0 and "held" in r and "held_after_reset" in r
    assert r["stats"]["replays"] >= 1 and r["stats"]["graph_breaks"] == 0, r
