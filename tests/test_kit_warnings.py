"""The conformance kit brings its own warning filters: run from a project that is not this repository (no
pyproject.toml filterwarnings), as a backend's author runs it, numpy's expected floating-point RuntimeWarnings
must not show, even with ``-W error::RuntimeWarning``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the conformance kit's oracle is PyTorch")
pytest.importorskip("ember_flex", reason="the kit runs on the flex backend here")

# tests that feed inf, nan and zero divisors to a numpy backend (log, reciprocal, var with one element, ...)
SELECTION = "(unary_op_matches_torch and log) or var_std_match_torch"


def _run_kit(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EMBER_", "PYTHONWARNINGS"))}
    env["PYTHONPATH"] = str(cwd)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "ember.testing",
           "--ember-device=flex", "-q", "-k", SELECTION, *extra]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_kit_outside_the_repository_shows_no_numpy_runtime_warnings(tmp_path: Path) -> None:
    # a bare project directory with its own (empty) pytest config, so none of this repository's settings apply,
    # and a tiny plugin that prints each collected kit test's filterwarnings marks
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "markspy.py").write_text(
        "def pytest_collection_finish(session):\n"
        "    for item in session.items:\n"
        "        specs = [a for m in item.iter_markers('filterwarnings') for a in m.args]\n"
        "        print('FILTERS', item.nodeid, specs)\n"
    )
    proc = _run_kit(tmp_path, "-W", "error::RuntimeWarning", "-p", "markspy", "-s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "passed" in out and "RuntimeWarning: " not in out, out[-3000:]
    # the quiet comes from the kit's own marks, one on every kit test
    marks = [line for line in proc.stdout.splitlines() if line.startswith("FILTERS ")]
    assert marks, out[-3000:]
    for line in marks:
        assert "encountered:RuntimeWarning" in line, line
