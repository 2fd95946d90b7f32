"""The ``ember`` command line: ``ember info [--json]``, ``ember bench``, ``ember --version``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ember
from ember import cli

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_DISABLE_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_info_prints_plugins_backends_and_default_device() -> None:
    out = _run("info")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith(f"ember {ember.__version__} (backend contract 1)")
    assert "default device: flex" in text
    lines = text.splitlines()
    backends = lines.index(next(line for line in lines if line.startswith("backends (")))
    flex_row = next(line for line in lines[backends:] if line.split()[:1] == ["flex"])
    assert flex_row.split()[:5] == ["flex", "cpu", "0", "1", "1"]
    assert any(line.split()[:3] == ["flex", "ember-flex", ember_flex_version()] for line in lines)
    assert "load errors: none" in text


def ember_flex_version() -> str:
    from importlib import metadata

    return metadata.version("ember-flex")


def test_info_json_is_valid_and_complete() -> None:
    out = _run("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert set(info) >= {"ember", "contract", "python", "numpy", "plugins", "backends", "decorators", "ops",
                         "plugin_info", "default_device", "errors"}
    assert info["ember"] == ember.__version__
    flex = next(b for b in info["backends"] if b["name"] == "flex")
    assert (flex["kind"], flex["devices"], flex["plugin"]) == ("cpu", 1, "flex")
    plugin = next(p for p in info["plugins"] if p["name"] == "flex")
    assert plugin == {"name": "flex", "distribution": "ember-flex", "version": ember_flex_version(),
                      "module": "ember_flex.plugin", "error": None}
    assert info["errors"] == []


def test_info_shows_load_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = {
        "ember": "0.0", "contract": 1, "python": "3", "implementation": "cpython", "platform": "x", "numpy": "2",
        "plugins": [{"name": "ghost", "distribution": "", "version": "", "module": "ghost.plugin",
                     "error": "import failed: ModuleNotFoundError: ghost"}],
        "backends": [], "decorators": [], "ops": [], "plugin_info": {}, "default_device": None,
        "errors": ["plugin 'ghost' (ghost.plugin): import failed: ModuleNotFoundError: ghost"],
    }
    import ember._info

    monkeypatch.setattr(ember._info, "collect", lambda: fake)
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "default device: none" in text
    assert "load errors (1):" in text and "ModuleNotFoundError: ghost" in text
    assert any(line.split()[:1] == ["ghost"] and line.rstrip().endswith("error") for line in text.splitlines())
    assert "backends (0):\n  none" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"ember {ember.__version__}"


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "info" in capsys.readouterr().out


def test_unknown_option_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["info", "--bogus"])
    assert exc.value.code == 2
    assert "--bogus" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "ember"
    if not script.exists():
        pytest.skip("no console script beside this interpreter")
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"ember {ember.__version__}"


def test_bench_quick_runs_the_overhead_benchmark(tmp_path: Path) -> None:
    if cli._find_overhead_benchmark() is None:
        pytest.skip("benchmarks/overhead.py is not in this checkout")
    path = tmp_path / "overhead.json"
    out = _run("bench", "overhead", "--quick", "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert "per-op eager overhead" in out.stdout and "ratio ember/numpy" in out.stdout
    result = json.loads(path.read_text())
    ember_s = result["add_seconds_per_op"]["ember (flex)"]
    assert 0 < ember_s["min"] <= ember_s["median"] <= ember_s["max"] < 1e-3
    assert result["import_ember_seconds"]["imported_by_import_ember"] == []
    assert result["environment"]["numpy"] and result["environment"]["cpu"]


def test_bench_without_the_benchmark_file_says_so(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "_find_overhead_benchmark", lambda: None)
    assert cli.main(["bench", "overhead"]) == 2
    assert "benchmarks/overhead.py was not found" in capsys.readouterr().err


def test_plain_bench_runs_the_suite_and_says_so_when_missing(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []
    monkeypatch.setattr(cli, "_find_benchmark", lambda name: seen.append(name))
    assert cli.main(["bench", "--quick"]) == 2
    assert seen == ["suite"]
    captured = capsys.readouterr()
    assert "ember bench suite:" in captured.out
    assert "benchmarks/suite.py was not found" in captured.err
    assert cli.main(["bench", "micro", "--quick"]) == 2
    assert seen == ["suite", "micro"]
