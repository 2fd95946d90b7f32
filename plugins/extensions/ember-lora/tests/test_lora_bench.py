"""`ember bench lora` is registered (entry point ``ember.benchmarks``); its pieces measure what they say on a small
scale (one fine-tuning method in this process, the NF4 error on a small matrix)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from ember_lora import bench

pytest.importorskip("ember_train")


def test_bench_registered() -> None:
    eps = [ep for ep in metadata.entry_points(group="ember.benchmarks") if ep.name == "lora"]
    assert eps and Path(eps[0].load()["script"]) == Path(bench.__file__)


def test_finetune_step_lora_counts_and_times(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember_train import models

    # a tiny configuration under the name "small" keeps the test fast; the code path is the full run's
    tiny = models.TransformerConfig(vocab_size=64, max_len=8, d_model=16, nhead=2, num_layers=1, dim_feedforward=32)
    monkeypatch.setitem(models.TRANSFORMER_CONFIGS, "small", tiny)
    row = bench.finetune_step("lora", "small", batch=2, steps=2)
    # adapters on linear1/linear2 and on the attention's q/k/v/out projections (r=8), and the head copy (16*4+4);
    # everything else frozen
    assert row["trainable"] == 8 * (16 + 32) + 8 * (32 + 16) + 4 * 8 * (16 + 16) + 16 * 4 + 4
    assert row["trainable_fraction"] == row["trainable"] / row["total"]
    assert len(row["step_ms_samples"]) == 2 and row["step_ms_median"] > 0
    assert row["pool_peak_bytes"] is None or row["pool_peak_bytes"] > 0
    with pytest.raises(Exception, match="method must be one of"):
        bench.finetune_step("dora", "small")


def test_nf4_rmse_matches_a_numpy_reconstruction(tmp_path: Path) -> None:
    rows = bench.nf4_rmse(n=256)
    by = {(r["format"], r["double_quant"]): r for r in rows}
    # N(0, 1) at block 64: bitsandbytes' NF4 gives about 0.092, FP4 more
    assert 0.085 < by[("nf4", False)]["rmse"] < 0.1 < by[("fp4", False)]["rmse"]
    assert by[("nf4", False)]["bytes_per_weight"] == 0.5625 > by[("nf4", True)]["bytes_per_weight"]
    out = tmp_path / "lora.json"
    assert bench.main(["--quick", "--sections", "nf4", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert [r["format"] for r in saved["nf4"]] == ["nf4", "nf4", "fp4", "fp4"]
    assert np.isfinite([r["rmse"] for r in saved["nf4"]]).all()


def test_matmul_probe_pool_bytes_and_times() -> None:
    import subprocess
    import sys

    from ember import Device
    from ember.errors import DeviceError, PluginError

    try:
        Device.parse("opencl")
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"no OpenCL device here: {exc}")
    # a 2048 x 1024 weight is two chunks of 2**20 weights: the kernel holds one chunk (4 MiB), dequantize-then-matmul
    # the whole float weight (8 MiB); each probe in a fresh interpreter, as the bench runs them
    above = {}
    for way in bench.MATMUL_WAYS:
        proc = subprocess.run([sys.executable, "-m", "ember_lora.bench", "--matmul-probe", way, "4", "2048", "1024",
                               "--device", "opencl"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        above[way] = json.loads(proc.stdout.strip().splitlines()[-1])["pool_peak_above_bytes"]
    mib = 1024 * 1024
    assert above["dequantize+matmul"] >= 8 * mib > above["kernel"] >= 4 * mib
    times = bench.matmul_times(8, 96, 128, device="opencl", repeats=1)
    assert times["max_abs_diff"] < 1e-4 and times["kernel_ms_median"] > 0
    with pytest.raises(Exception, match="way must be one of"):
        bench.matmul_probe("fused", 1, 64, 64)
