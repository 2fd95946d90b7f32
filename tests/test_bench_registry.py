"""``ember bench NAME`` finds benchmarks through the entry-point group ``ember.benchmarks``: the packages that ship
a benchmark register it, and core's CLI names none of them."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from ember import cli

ROOT = Path(__file__).resolve().parents[1]
#: every name `ember bench` took before the registry; each must keep working
LEGACY = ("overhead", "autodiff", "micro", "opencl", "fusion", "suite")


def _distribution(path: Path, name: str, entry_points: str) -> str:
    """A metadata-only distribution with the given entry_points.txt; the returned PYTHONPATH makes it installed."""
    info = path / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


def _run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_DEVICE", "EMBER_DEBUG")}
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**env, **extra_env}, timeout=300)


def test_every_legacy_benchmark_name_is_registered_with_its_script() -> None:
    names = cli._benchmark_names()
    assert set(LEGACY) <= set(names), f"registered: {names}"
    for name in names:
        spec = cli._benchmark(name)
        assert spec is not None and spec["description"], name
        path = cli._find_benchmark(name)
        assert path is not None and path == ROOT / "benchmarks" / spec["script"], name
        assert "def main(" in path.read_text(encoding="utf-8"), name


def test_benchmarks_are_registered_by_the_packages_that_ship_them() -> None:
    owners = {ep.name: ep.dist.metadata["Name"] for ep in metadata.entry_points(group=cli.BENCHMARK_GROUP)
              if ep.dist is not None}
    assert not {n for n, dist in owners.items() if dist in ("ember-core", "ember")}, owners
    assert owners["opencl"] == "ember-opencl" and owners["fusion"] == "ember-fusion"
    assert owners["autodiff"] == "ember-autodiff"


def test_a_third_party_benchmark_with_its_own_script_runs(tmp_path: Path) -> None:
    script = tmp_path / "pkg" / "mybench_script.py"
    script.parent.mkdir()
    script.write_text("import sys\n\ndef main(argv):\n    print('mybench ran with', argv)\n    return 3\n")
    (tmp_path / "pkg" / "mybench_registration.py").write_text(
        f"BENCHMARK = {{'description': 'a third-party benchmark', 'script': {str(script)!r}}}\n")
    path = _distribution(tmp_path / "site", "mybench",
                         "[ember.benchmarks]\nmybench = mybench_registration:BENCHMARK\n")
    out = _run("bench", "mybench", "--quick", "x", PYTHONPATH=os.pathsep.join([str(tmp_path / "pkg"), path]))
    assert out.returncode == 3, out.stderr
    assert "ember bench mybench: a third-party benchmark" in out.stdout
    assert "mybench ran with ['--quick', 'x']" in out.stdout
    help_text = _run("bench", "--help", PYTHONPATH=os.pathsep.join([str(tmp_path / "pkg"), path])).stdout
    assert "mybench" in help_text and "ember.benchmarks" in help_text


def test_an_unregistered_benchmark_is_refused_with_the_registered_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "nosuchbench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "no installed package registers a benchmark 'nosuchbench'" in err
    assert all(name in err for name in LEGACY)


def test_a_broken_registration_is_a_plugin_error_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    class FakeEntryPoint:
        name, value, dist = "broken", "somewhere:THING", None

        @staticmethod
        def load() -> Any:
            return ["not", "a", "mapping"]

    real = metadata.entry_points

    def entry_points(**kw: Any) -> Any:
        found = list(real(**kw))
        return found + [FakeEntryPoint()] if kw.get("group") == cli.BENCHMARK_GROUP else found

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    assert cli.main(["bench", "broken"]) == 1
    err = capsys.readouterr().err
    assert "PluginError" in err and "benchmark 'broken' (somewhere:THING)" in err and "expected a dict" in err


def test_core_cli_names_no_benchmark_package() -> None:
    text = (ROOT / "packages" / "ember-core" / "src" / "ember" / "cli.py").read_text(encoding="utf-8")
    for plugin in ("flex", "opencl", "autodiff", "fusion"):
        assert plugin not in text, plugin
