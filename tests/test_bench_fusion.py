"""Smoke test of the fusion benchmark: ``ember bench fusion --quick --json PATH`` runs every section, its figures are
self-consistent, and fused and unfused devices computed the same results.

No timing is asserted (CI machines are noisy, and the code generators set how fast fusion is): only that every
figure exists, is positive and agrees with itself, and that fused and unfused outputs agree. The OpenCL figures are
checked where ``Device.opencl(0)`` exists and must be absent where it does not.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "fusion.py"
FUSED_KEYS = ("fused_case", "unfused_case", "fusion_active", "speedup_fused", "max_rel_diff", "tolerance", "agree")


def _env(**extra: str) -> dict[str, str]:
    """This environment without settings that would change which devices the benchmark gets."""
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_DISABLE_PLUGINS", "EMBER_FUSION")}
    return {**env, **extra}


def _check_stats(stats: dict[str, float], what: str) -> None:
    assert 0 < stats["min"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["max"], what
    assert stats["iqr"] == pytest.approx(stats["q3"] - stats["q1"]), what


def _check_common(fig: dict[str, Any], has_torch: bool, fusion_on: bool = True) -> None:
    """What every figure carries: spreads, the fused speedup, the torch ratio and fused/unfused agreement."""
    name = fig["name"]
    for key in FUSED_KEYS:
        assert key in fig, (name, key)
    s = fig["seconds"]
    assert fig["ember_case"] == fig["fused_case"] and fig["fused_case"] in s and fig["unfused_case"] in s, name
    assert fig["fused_case"].endswith(" fused") and fig["unfused_case"].endswith(" unfused"), name
    for stats in s.values():
        _check_stats(stats, name)
    assert fig["speedup_fused"] == pytest.approx(s[fig["unfused_case"]]["median"] / s[fig["fused_case"]]["median"])
    # torch has no backend-level handles: those overhead figures are ember only
    if has_torch and fig.get("level") != "backend":
        assert fig["torch_case"] in s, name
        fused, torch = s[fig["fused_case"]]["median"], s[fig["torch_case"]]["median"]
        assert fig["ratio_ember_torch"] == pytest.approx(fused / torch), name
    else:
        assert fig["torch_case"] not in s and fig["ratio_ember_torch"] is None, name
    # fused and unfused computed the same thing (the benchmark's own check, re-asserted here)
    assert math.isfinite(fig["max_rel_diff"]) and 0 <= fig["max_rel_diff"] <= fig["tolerance"], (name, fig)
    assert fig["agree"] is True, name
    assert fig["fusion_active"] is fusion_on, name


def _check_gelu(figs: list[dict[str, Any]], backends: list[str], has_torch: bool) -> None:
    assert [f["backend"] for f in figs] == backends
    for fig in figs:
        _check_common(fig, has_torch)
        assert "1M f32" in fig["name"] and fig["unit"] == "ms"
        assert fig["fused_case"] == f"ember {fig['backend']} fused"
        assert fig["target_speedup"] == {"flex": 2.0, "opencl": 3.0}[fig["backend"]]
        assert fig["target_met"] is (fig["speedup_fused"] >= fig["target_speedup"])
        assert ("numpy" in fig["seconds"]) is (fig["backend"] == "flex")
        # both flavours against a float64 numpy reference: float32 rounding only
        assert fig["rel_err_vs_numpy"]["fused"] < 1e-5 and fig["rel_err_vs_numpy"]["unfused"] < 1e-5
        # the chain ends in one realization; it runs as at least one kernel, compiled or interpreted
        assert fig["kernels_per_call"] >= 1
        assert fig["codegen"]["compiled"] >= 0 and fig["codegen"]["interpreted"] >= 0


def _check_train(figs: list[dict[str, Any]], has_torch: bool) -> None:
    assert [(f["model"], f["batch"], f["backend"]) for f in figs] == [("cnn", 8, "flex"),
                                                                     ("transformer-small", 2, "flex")]
    for fig in figs:
        _check_common(fig, has_torch)
        assert fig["fused_case"] == "ember flex+autodiff fused" and fig["unfused_case"] == "ember flex+autodiff unfused"
        c = fig["plan_cache"]
        assert c["steps"] >= 2 and c["measured_steps"] == c["steps"] - 1
        assert c["hits"] >= 0 and c["misses"] >= 0 and c["eager_per_step"] >= 0, c
        if c["hits"] + c["misses"]:
            assert c["hit_rate"] == pytest.approx(c["hits"] / (c["hits"] + c["misses"])) and 0 <= c["hit_rate"] <= 1
            # a repeated step replays what the first one planned: the first step missed at least once, later ones
            # mostly hit
            assert c["first_step"]["misses"] > 0 and c["kernels_run_per_step"] > 0 and c["realizations_per_step"] > 0
            assert c["codegen"]["compiled"] + c["codegen"]["interpreted"] > 0
        else:  # every tensor below the device's eager_below: each op ran at once, nothing was planned
            assert c["hit_rate"] is None and c["eager_per_step"] > 0, c
        lf, lu = np.array(fig["losses"]["fused"]), np.array(fig["losses"]["unfused"])
        assert len(lf) == len(lu) == c["steps"] and np.all(np.isfinite(lf)) and np.all(lf > 0)
        assert fig["max_rel_diff"] == pytest.approx(float(np.max(np.abs(lf - lu)) / np.max(np.abs(lu))), abs=1e-12)
        assert fig["max_rel_diff_params"] >= 0 and fig["worst_param"]


def _check_overhead(figs: list[dict[str, Any]], has_torch: bool, fusion_on: bool = True) -> None:
    assert [f["level"] for f in figs] == ["backend", "backend", "tensor", "tensor"]
    for fig in figs:
        _check_common(fig, has_torch, fusion_on)
        assert fig["unit"] == "us"
        assert fig["us_per_op"] == pytest.approx({k: v["median"] * 1e6 for k, v in fig["seconds"].items()})
        # the per-op rows (recording on handles, Tensor a + b) carry the 5 us target; the kept chains do not
        per_op = "recorded only" in fig["name"] or fig["name"].startswith("Tensor a + b")
        assert ("target_us_per_op" in fig) is per_op, fig["name"]
        if per_op:
            assert fig["target_us_per_op"] == 5.0
            assert fig["target_met"] is (fig["us_per_op"][fig["fused_case"]] <= 5.0)


def _run(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


def test_quick_fusion_bench_reports_every_section(tmp_path: Path) -> None:
    if not SCRIPT.is_file():
        pytest.skip("benchmarks/fusion.py is not in this checkout")
    path = tmp_path / "fusion.json"
    out = _run(["-m", "ember.cli", "bench", "fusion", "--quick", "--json", str(path)], _env())
    # exit 1 means a workload failed or fused and unfused disagreed; the JSON says which
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ember bench fusion" in out.stdout
    result = json.loads(path.read_text())
    assert result["benchmark"] == "fusion" and result["quick"] is True
    assert result["sections"] == ["gelu", "train", "overhead"]
    assert result["errors"] == []
    assert set(result["section_seconds"]) == set(result["sections"])
    has_torch = result["environment"]["torch"] is not None
    ocl = result["opencl"]
    backends = ["flex", "opencl"] if ocl["available"] else ["flex"]
    assert result["backends"] == backends
    assert ocl["device"].startswith("fusion over opencl:0") if ocl["available"] else "opencl" in ocl["reason"].lower()
    assert result["train_backends"] == ["flex"]  # quick mode leaves OpenCL out of the training section

    by_section: dict[str, list[dict[str, Any]]] = {}
    for fig in result["figures"]:
        by_section.setdefault(fig["section"], []).append(fig)
    assert set(by_section) == {"gelu", "train", "overhead"}
    _check_gelu(by_section["gelu"], backends, has_torch)
    _check_train(by_section["train"], has_torch)
    _check_overhead(by_section["overhead"], has_torch)
    assert "fused speedup" in out.stdout and "plan cache over steps 2..2" in out.stdout
    assert "recording target" in out.stdout


def test_sections_option_and_fusion_switched_off(tmp_path: Path) -> None:
    """--sections picks sections; with EMBER_FUSION=0 the benchmark still runs and says fusion is not active."""
    if not SCRIPT.is_file():
        pytest.skip("benchmarks/fusion.py is not in this checkout")
    bad = _run([str(SCRIPT), "--sections", "nope"], _env(), timeout=300)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    path = tmp_path / "overhead.json"
    out = _run([str(SCRIPT), "--quick", "--sections", "overhead", "--json", str(path)], _env(EMBER_FUSION="0"),
               timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["sections"] == ["overhead"] and result["errors"] == []
    assert {f["section"] for f in result["figures"]} == {"overhead"} and result["train_backends"] is None
    _check_overhead(result["figures"], result["environment"]["torch"] is not None, fusion_on=False)
    assert "fusion NOT active" in out.stdout
