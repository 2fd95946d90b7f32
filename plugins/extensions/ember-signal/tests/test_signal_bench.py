"""`ember bench signal` is registered (entry point ``ember.benchmarks``) and its quick run writes rows for ember and
torch side by side."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from ember_signal import bench


def test_bench_registered_and_quick_run_writes_rows(tmp_path: Path) -> None:
    eps = [ep for ep in metadata.entry_points(group="ember.benchmarks") if ep.name == "signal"]
    assert eps and Path(eps[0].load()["script"]) == Path(bench.__file__)
    out = tmp_path / "signal.json"
    assert bench.main(["--quick", "--only", "rfft", "stft(n_fft=512)", "--min-time", "0.001", "--json",
                       str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["function"] for r in rows] == ["rfft", "stft(n_fft=512)"]
    for r in rows:
        assert r["ember_fwd_us"] > 0 and r["torch_fwd_us"] > 0 and r["torch_fwd_bwd_us"] > 0
