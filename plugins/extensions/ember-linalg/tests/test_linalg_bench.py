"""`ember bench linalg`: registered through the ``ember.benchmarks`` entry points, runs from the package and prints
a row per function and shape against torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ember import cli


def test_bench_is_registered_with_a_script_inside_the_package() -> None:
    spec = cli._benchmark("linalg")
    assert spec is not None and "torch" in spec["description"]
    path = cli._find_benchmark("linalg")
    assert path is not None and path.name == "bench.py" and path.parent.name == "ember_linalg"


def test_quick_run_prints_the_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = cli._find_benchmark("linalg")
    assert path is not None
    out = tmp_path / "linalg.json"
    assert cli._load_module(path).main(["--quick", "--only", "inv", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| inv | 8x8 |" in table and "| inv | 4x4x4 |" in table
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(r["ember_us"] > 0 and r["torch_fwd_bwd_us"] > 0 for r in rows)
