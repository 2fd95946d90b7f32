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


def _run(*args: str, cwd: Path = ROOT, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("EMBER_DEVICE", "EMBER_DISABLE_PLUGINS", "EMBER_STRICT_PLUGINS", "EMBER_DEBUG")}
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**env, **extra_env}, timeout=120)


def _ghost_distribution(path: Path) -> str:
    """A distribution (metadata only) whose ``ember`` entry point names a module that does not exist: put the
    returned folder on PYTHONPATH and importlib.metadata finds it like any installed plugin."""
    info = path / "ghostdist-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ghostdist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ember]\nghost = ember_ghost_missing_module.plugin\n")
    return os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


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
                      "module": "ember_flex.plugin", "error": None, "conflicts": []}
    assert info["errors"] == [] and info["conflicts"] == [] and info["strict"] is False


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


# -- strict mode, conflicts and error reporting (issues 13 and 14) -------------------------------------------------
def test_strict_info_blames_only_the_broken_plugin_and_fails(tmp_path: Path) -> None:
    path = _ghost_distribution(tmp_path)
    out = _run("info", EMBER_STRICT_PLUGINS="1", PYTHONPATH=path)
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout
    assert "load errors (1):" in text
    assert "plugin 'ghost' (ember_ghost_missing_module.plugin): import failed: ModuleNotFoundError" in text
    assert "already registered" not in text + out.stderr and "registration failed" not in text
    assert "default device: none (EMBER_STRICT_PLUGINS=1 and a plugin failed to load)" in text
    flex_row = next(line for line in text.splitlines() if line.split()[:1] == ["flex"])
    assert flex_row.rstrip().endswith("ok")
    # without strict mode the same installation works, reports the plugin and exits 0
    out = _run("info", "--json", PYTHONPATH=path)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["default_device"] == "flex" and info["strict"] is False
    assert [e for e in info["errors"] if "ghost" in e] == info["errors"] and len(info["errors"]) == 1


def test_strict_lookups_raise_the_first_error_every_time(tmp_path: Path) -> None:
    code = (
        "import ember\n"
        "for _ in range(3):\n"
        "    try:\n"
        "        ember.Device.flex()\n"
        "    except ember.PluginError as exc:\n"
        "        print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    env.update(EMBER_STRICT_PLUGINS="1", PYTHONPATH=_ghost_distribution(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and len(set(lines)) == 1, out.stdout + out.stderr
    assert lines[0].startswith("ember plugin 'ghost' (ember_ghost_missing_module.plugin): import failed")


def test_info_shows_name_conflicts(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import ember._info

    fake = {
        "ember": "0.0", "contract": 1, "python": "3", "implementation": "cpython", "platform": "x", "numpy": "2",
        "strict": True, "default_device": "flex", "default_device_error": None,
        "plugins": [{"name": "evil", "distribution": "evil-dist", "version": "1", "module": "evil.plugin",
                     "error": None, "conflicts": ["backend 'flex'"]}],
        "backends": [], "decorators": [], "ops": [], "plugin_info": {},
        "conflicts": [{"what": "backend", "name": "flex", "winner": "flex", "loser": "evil",
                       "reason": "the plugin named 'flex' owns the name"}],
        "errors": ["name conflict: backend 'flex' is registered by plugins 'flex' and 'evil'"],
    }
    monkeypatch.setattr(ember._info, "collect", lambda: fake)
    assert cli.main(["info"]) == 1  # strict mode and a load problem
    text = capsys.readouterr().out
    assert "name conflicts (1):" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["backend", "flex"])
    assert row.split()[2:4] == ["flex", "evil"] and "owns the name" in row
    assert any(line.split()[:1] == ["evil"] and line.rstrip().endswith("conflict") for line in text.splitlines())


def test_train_without_ember_train_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda **kw: [] if kw.get("group") == "ember.commands" else real(**kw))
    assert cli.main(["train", "--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" not in err and len(err.strip().splitlines()) == 2
    assert "ember train:" in err and "pip install ember-train" in err and "pip install ember" in err


def test_train_with_a_bad_device_is_two_lines_and_debug_shows_the_traceback() -> None:
    pytest.importorskip("ember_train")
    out = _run("train", "--device", "nosuchgpu", "--quick")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("ember train: PluginError: no backend named 'nosuchgpu' is installed")
    assert "no plugin provides this device" in lines[0] and "--device" in lines[1]
    for debug in (("--debug",), ()):
        out = _run("train", "--device", "nosuchgpu", "--quick", *debug, **({} if debug else {"EMBER_DEBUG": "1"}))
        assert out.returncode == 1 and "Traceback (most recent call last)" in out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith("ember.errors.PluginError: no backend named 'nosuchgpu'")


def test_unexpected_errors_are_short_unless_debugging(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import ember._info

    def boom() -> dict:
        raise RuntimeError("boom")

    monkeypatch.delenv("EMBER_DEBUG", raising=False)
    monkeypatch.setattr(ember._info, "collect", boom)
    assert cli.main(["info"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ember info: unexpected RuntimeError: boom",
                   "  (run with --debug or EMBER_DEBUG=1 for the traceback)"]
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["--debug", "info"])
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["info", "--debug"])
    monkeypatch.setenv("EMBER_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["info"])
