"""Every script in examples/ runs with ``--quick`` (a tiny configuration) and prints its result line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

CASES = [
    ("seed_cnn.py", "final validation accuracy"),
    ("seed_cnn_manual_loop.py", "final validation accuracy"),
    ("regression_csv.py", "final validation MSE"),
    ("text_transformer.py", "final validation accuracy"),
    ("inference.py", "validation accuracy"),
]


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(name for name, _ in CASES)


@pytest.mark.parametrize("script, key", CASES)
def test_example_runs_quick(tmp_path, script, key):
    # run in a temp folder: the examples write runs/... relative to the working directory
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), "--quick"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert key in proc.stdout, proc.stdout[-3000:]


def test_inference_refuses_another_models_checkpoint(tmp_path):
    code = ("import ember; from ember import nn, records; "
            f"records.save(nn.Linear(3, 2), {str(tmp_path / 'other.safetensors')!r})")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    proc = subprocess.run([sys.executable, str(EXAMPLES / "inference.py"), str(tmp_path / "other.safetensors")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "IncompatibleStateError" in proc.stderr and "conv1.weight" in proc.stderr
