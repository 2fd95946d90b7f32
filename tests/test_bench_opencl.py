"""Smoke test of the OpenCL benchmark: ``ember bench opencl --quick --json PATH`` runs and reports every section.

No timing is asserted (CI machines are noisy); only that every figure exists, is positive and is self-consistent,
and that the warm run really hit the kernel cache. Skipped where there is no OpenCL device (after checking that the
script says so and still exits 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "opencl.py"


def _check_stats(stats: dict[str, float], what: str) -> None:
    assert 0 < stats["min"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["max"], what
    assert stats["iqr"] == pytest.approx(stats["q3"] - stats["q1"]), what


def _check_figures(figures: list[dict[str, Any]], has_torch: bool) -> None:
    matmul = [f for f in figures if f["section"] == "matmul"]
    cnn = [f for f in figures if f["section"] == "cnn"]
    assert len(matmul) == 2 and any("64x1600 @ 1600x128" in f["name"] for f in matmul)
    assert len(cnn) == 1 and "batch 8" in cnn[0]["name"]
    for fig in figures:
        assert fig["ember_case"] in fig["seconds"], fig["name"]
        for stats in fig["seconds"].values():
            _check_stats(stats, fig["name"])
        if has_torch:
            assert fig["torch_case"] in fig["seconds"], fig["name"]
            assert fig["ratio_ember_torch"] == pytest.approx(
                fig["seconds"][fig["ember_case"]]["median"] / fig["seconds"][fig["torch_case"]]["median"])
        else:
            assert fig["ratio_ember_torch"] is None
    for fig in matmul:
        s = fig["seconds"]
        assert fig["ember_case"] == "ember opencl" and "numpy" in s
        assert fig["pct_of_numpy"] == pytest.approx(100 * s["numpy"]["median"] / s["ember opencl"]["median"])
        assert set(fig["gflops"]) == set(s)
        for case, rate in fig["gflops"].items():
            assert rate == pytest.approx(fig["work"] / s[case]["median"]) and rate > 0
    s = cnn[0]["seconds"]
    assert cnn[0]["ember_case"] == "ember opencl+autodiff" and "ember flex+autodiff" in s
    assert cnn[0]["ratio_opencl_flex"] == pytest.approx(
        s["ember opencl+autodiff"]["median"] / s["ember flex+autodiff"]["median"])


def _check_cold_warm(cw: dict[str, Any]) -> None:
    assert cw["workload"] == "matmul" and "quick" in cw["description"]  # quick mode says what it ran
    assert cw["warm_runs"] == len(cw["warm"]) >= 1
    runs = [cw["cold"], *cw["warm"]]
    for run in runs:
        assert run["first_step_seconds"] > 0 and run["runtime_init_seconds"] > 0
        # the process also imported and started up: its wall time covers the timed part
        assert run["process_seconds"] > run["first_step_seconds"] + run["runtime_init_seconds"]
        assert isinstance(run["tune_file"], bool)
    assert cw["first_step_seconds"]["cold"] == cw["cold"]["first_step_seconds"]
    assert cw["ratio_cold_warm"] == pytest.approx(cw["first_step_seconds"]["cold"] / cw["first_step_seconds"]["warm"])
    assert cw["ratio_cold_warm_process"] == pytest.approx(
        cw["process_seconds"]["cold"] / cw["process_seconds"]["warm"])
    # the cold run compiled into the fresh cache; every warm run found all of it there
    assert cw["cold"]["kernels"]["compiled"] > 0 and cw["cold"]["kernels"]["disk_hits"] == 0
    assert cw["cache_bytes_after_cold"]["ember"] > 0
    for run in cw["warm"]:
        assert run["kernels"]["compiled"] == 0 and run["kernels"]["disk_hits"] > 0, run["kernels"]
        assert run["loss"] == cw["cold"]["loss"]  # same workload, same result


def _check_memory(mem: dict[str, Any]) -> None:
    assert mem["batch"] == 8 and set(mem["modes"]) == {"dry_run", "no_dry_run"}
    for mode, m in mem["modes"].items():
        assert 0 < m["in_use"] <= m["peak"], mode
        assert m["in_use"] <= m["held"] <= m["reserved"], mode
        assert m["reserved_over_peak"] == pytest.approx(m["reserved"] / m["peak"]), mode
        assert m["reserved"] <= m["peak_reserved"], mode
        assert m["peak_reserved_over_peak"] == pytest.approx(m["peak_reserved"] / m["peak"]), mode
        assert m["raw_allocations_in_step"] >= 0 and m["live_blocks"] > 0, mode
    dry, plain = mem["modes"]["dry_run"], mem["modes"]["no_dry_run"]
    assert plain["dry_run"] is None and plain["plan_reserved"] == 0
    plan = dry["dry_run"]
    assert plan["allocations"] > 0 and plan["plan_bytes"] > 0 and plan["peak_in_use"] > 0
    # the measured step repeats the recorded one: the plan serves its allocations
    assert dry["plan_allocations_in_step"] > 0 and dry["plan_reserved"] == plan["plan_bytes"]
    # same model, batch and step count in both interpreters: the same live memory afterwards
    assert dry["in_use"] == plain["in_use"]


def test_quick_opencl_bench_reports_every_section(tmp_path: Path) -> None:
    if not SCRIPT.is_file():
        pytest.skip("benchmarks/opencl.py is not in this checkout")
    path = tmp_path / "opencl.json"
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_DISABLE_PLUGINS")}
    out = subprocess.run([sys.executable, "-m", "ember.cli", "bench", "opencl", "--quick", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ember bench opencl" in out.stdout
    result = json.loads(path.read_text())
    assert result["benchmark"] == "opencl" and result["quick"] is True
    assert result["sections"] == ["matmul", "cnn", "coldwarm", "memory"]
    if not result["available"]:
        assert "no OpenCL device" in out.stdout and result["reason"]
        pytest.skip(f"no OpenCL device: {result['reason']}")
    assert "opencl:0" in result["device"]  # "fusion over opencl:0 (...)" when ember-fusion is installed
    has_torch = result["environment"]["torch"] is not None
    _check_figures(result["figures"], has_torch)
    _check_cold_warm(result["cold_warm"])
    _check_memory(result["memory"])
    assert set(result["section_seconds"]) == set(result["sections"])
    assert "reserved/peak" in out.stdout and "cold/warm" in out.stdout and "GFLOP/s" in out.stdout


def test_sections_option_runs_only_those(tmp_path: Path) -> None:
    """--sections picks sections; a bad section name is an argparse error (exit 2), not a traceback."""
    if not SCRIPT.is_file():
        pytest.skip("benchmarks/opencl.py is not in this checkout")
    bad = subprocess.run([sys.executable, str(SCRIPT), "--sections", "nope"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    path = tmp_path / "matmul.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--sections", "matmul", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["sections"] == ["matmul"]
    if not result["available"]:
        pytest.skip(f"no OpenCL device: {result['reason']}")
    assert {f["section"] for f in result["figures"]} == {"matmul"}
    assert result["cold_warm"] is None and result["memory"] is None


def test_without_an_opencl_device_it_says_so_and_exits_0(tmp_path: Path) -> None:
    """An ICD loader pointed at an empty vendor directory finds no platform: a clear message, exit 0, JSON."""
    if not SCRIPT.is_file():
        pytest.skip("benchmarks/opencl.py is not in this checkout")
    vendors = tmp_path / "no-icd"
    vendors.mkdir()
    path = tmp_path / "none.json"
    env = {**os.environ, "OCL_ICD_VENDORS": str(vendors)}
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--sections", "matmul", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(path.read_text())
    if result["available"]:
        pytest.skip("this ICD loader ignores OCL_ICD_VENDORS: cannot hide the OpenCL devices")
    assert "no OpenCL device" in out.stdout and "opencl" in result["reason"].lower()
    assert result["benchmark"] == "opencl" and result["environment"]["numpy"]
    assert "figures" not in result
