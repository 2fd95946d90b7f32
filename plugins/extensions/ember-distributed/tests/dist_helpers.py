"""Shared helpers of the ember-distributed tests: run the rank programs of ``dist_worker.py`` under mpiexec."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("dist_worker.py")


def mpiexec() -> str:
    """The mpiexec next to this Python, or on PATH; skips the test (naming why) when there is none."""
    pytest.importorskip("mpi4py", reason="ember-distributed tests need mpi4py (pip install mpi4py mpich)")
    local = Path(sys.executable).with_name("mpiexec")
    exe = str(local) if local.exists() else shutil.which("mpiexec")
    if not exe:
        pytest.skip("ember-distributed tests need an mpiexec (pip install mpich)")
    return exe


def run_ranks(n: int, *args: str, timeout: float = 120, launcher: list[str] | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n n python dist_worker.py args...`` (or ``launcher`` + the same), with a wall-clock limit."""
    cmd = (launcher or [mpiexec(), "-n", str(n)]) + [sys.executable, str(WORKER), *args]
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


def check(proc: subprocess.CompletedProcess[str]) -> None:
    """Fail with the ranks' output when they did not all succeed."""
    assert proc.returncode == 0, f"ranks failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


def worker_module() -> Any:
    """``dist_worker.py`` imported in the test process (its single-process reference training)."""
    spec = importlib.util.spec_from_file_location("ember_distributed_test_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
