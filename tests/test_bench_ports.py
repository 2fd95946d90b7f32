"""Smoke test of the ports benchmark (``benchmarks/ports.py``, ``ember bench ports``): it times every program of
``examples/ports/`` for torch, ember fused and ember unfused, its figures are self-consistent, and the suite also
runs it as its optional ``ports`` section (``ember bench --only ports``).

No timing is asserted (CI machines are noisy): only that every figure exists, is positive and agrees with itself.
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
SCRIPT = ROOT / "benchmarks" / "ports.py"
PROGRAMS = sorted(p.stem for p in (ROOT / "examples" / "ports").glob("*.py"))


def _env() -> dict[str, str]:
    """This environment without settings that would change which devices the benchmark gets."""
    return {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_DISABLE_PLUGINS", "EMBER_FUSION")}


@pytest.mark.skipif(not SCRIPT.is_file(), reason="benchmarks/ports.py is not in this checkout")
def test_quick_ports_benchmark_times_every_program(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    # one thread each: on a busy CI machine spinning thread pools would only make the smoke test slow
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fused/torch" in out.stdout and "unfused/torch" in out.stdout and "fused/unfused" in out.stdout
    result = json.loads(path.read_text())
    assert result["benchmark"] == "ports" and result["quick"] is True and result["threads"] == 1
    figures = result["figures"]
    assert sorted(f["program"] for f in figures) == PROGRAMS  # every example port has a row
    has_torch = result["environment"]["torch"] is not None
    for fig in figures:
        s = fig["seconds"]
        assert fig["section"] == "ports" and fig["unit"] == "ms"
        assert fig["ember_case"] == fig["fused_case"] == "ember fused" and fig["unfused_case"] == "ember unfused"
        assert set(s) == {"ember fused", "ember unfused"} | ({"torch cpu"} if has_torch else set())
        for stats in s.values():
            assert 0 < stats["min"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["max"], fig["name"]
        assert fig["speedup_fused"] == pytest.approx(s["ember unfused"]["median"] / s["ember fused"]["median"])
        if has_torch:
            assert fig["ratio_ember_torch"] == pytest.approx(s["ember fused"]["median"] / s["torch cpu"]["median"])
            assert fig["ratio_unfused_torch"] == pytest.approx(
                s["ember unfused"]["median"] / s["torch cpu"]["median"])
        row = [line.split() for line in out.stdout.splitlines() if line.startswith(fig["program"] + " ")]
        assert len(row) == 1 and float(row[0][2]) == pytest.approx(s["ember fused"]["median"] * 1e3, abs=0.01)


def test_suite_runs_ports_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ember bench --only ports`` reaches ports.run; plain ``ember bench`` (no --only) does not."""
    bench_dir = ROOT / "benchmarks"
    monkeypatch.syspath_prepend(str(bench_dir))
    for name, mod in list(sys.modules.items()):  # the scripts' generic names (suite, micro, models, ...) leave
        if Path(getattr(mod, "__file__", None) or "/").parent == bench_dir:  # sys.modules with this test
            monkeypatch.delitem(sys.modules, name)
    for name in ("ports", "suite", "micro", "models", "transformer", "_common"):
        monkeypatch.setitem(sys.modules, name, None)  # recorded as absent: the test's imports are undone after it
        del sys.modules[name]
    import ports
    import suite

    calls: list[bool] = []

    def fake_run(quick: bool, programs: Any = ()) -> list[dict[str, Any]]:
        calls.append(quick)
        return []

    monkeypatch.setattr(ports, "run", fake_run)
    assert "ports" not in suite.SECTIONS and "ports" in suite.OPTIONAL_SECTIONS
    result = suite.run(True, ["ports"])
    assert result["sections"] == ["ports"] and calls == [True]
    # the default run (no --only) takes SECTIONS alone: emptied, it runs nothing, and the ports stay out
    monkeypatch.setattr(suite, "SECTIONS", ())
    assert suite.run(True, [])["sections"] == [] and calls == [True]


def test_ports_benchmark_is_registered() -> None:
    """``ember bench ports`` finds benchmarks/ports.py through the entry-point group (ember-flex registers it)."""
    from ember import cli

    spec = cli._benchmark("ports")
    assert spec is not None and spec["script"] == "ports.py" and "ports" in spec["description"]
    assert cli._find_benchmark("ports") == SCRIPT
