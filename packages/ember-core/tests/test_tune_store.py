"""ember.utils.tune_store: the autotune result store backends share (persistence, merging, failures, threads)."""

from __future__ import annotations

import json
import pathlib
import threading

import pytest

from ember.errors import ValueRangeError
from ember.utils.tune_store import FORMAT, AutotuneError, TuneStore, atomic_write, cache_dir


def store(path: pathlib.Path, **kw: object) -> TuneStore:
    return TuneStore(path / "dev" / "tune.json", owner="test-backend", device="dev0", **kw)  # type: ignore[arg-type]


def test_tune_picks_the_fastest_and_remembers_it_across_instances(tmp_path: pathlib.Path) -> None:
    times = {1: 0.3, 2: 0.1, 4: 0.2}
    calls: list[int] = []

    def run(cfg: dict[str, int]) -> float:
        calls.append(cfg["tile"])
        return times[cfg["tile"]]

    cands = [{"tile": t} for t in times]
    assert store(tmp_path).tune("matmul", "f32|64", cands, run) == {"tile": 2}
    assert calls == [1, 2, 4]
    again = store(tmp_path)  # a new process reads the file: no timing
    assert again.tune("matmul", "f32|64", cands, run) == {"tile": 2} and calls == [1, 2, 4]
    data = json.loads((tmp_path / "dev" / "tune.json").read_text())
    assert data == {"format": FORMAT, "entries": {"matmul": {"f32|64": {"tile": 2}}}}
    # a stored winner no longer among the candidates is retuned
    assert again.tune("matmul", "f32|64", [{"tile": 1}, {"tile": 4}], run) == {"tile": 4}


def test_two_stores_merge_their_entries(tmp_path: pathlib.Path) -> None:
    a, b = store(tmp_path), store(tmp_path)
    a.put("conv", "k1", {"algo": "gemm"})
    b.put("matmul", "k2", {"tile": 8})
    merged = json.loads((tmp_path / "dev" / "tune.json").read_text())["entries"]
    assert merged == {"conv": {"k1": {"algo": "gemm"}}, "matmul": {"k2": {"tile": 8}}}
    assert b.get("conv", "k1") == {"algo": "gemm"}  # a miss rereads the file another store wrote


def test_failures_unreadable_files_and_bad_values(tmp_path: pathlib.Path) -> None:
    class BackendAutotuneError(AutotuneError):
        pass

    s = store(tmp_path, error=BackendAutotuneError)

    def boom(cfg: dict[str, int]) -> float:
        if cfg["tile"] == 1:
            raise RuntimeError("CL_INVALID_WORK_GROUP_SIZE")
        return float("nan")

    with pytest.raises(BackendAutotuneError, match=r"(?s)'mm' for 'k'.*dev0.*all 2 candidate.*INVALID_WORK_GROUP.*nan"):
        s.tune("mm", "k", [{"tile": 1}, {"tile": 2}], boom)
    with pytest.raises(ValueRangeError, match="no candidate"):
        s.tune("mm", "k", [], boom)
    with pytest.raises(ValueRangeError, match="must be a dict"):
        s.put("mm", "k", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueRangeError, match="JSON"):
        s.put("mm", "k", {"f": object()})
    atomic_write(tmp_path / "bad" / "tune.json", b"{not json")
    assert TuneStore(tmp_path / "bad" / "tune.json", owner="t", device="d").get("mm", "k") is None
    atomic_write(tmp_path / "old" / "tune.json", json.dumps({"format": FORMAT + 1, "entries": {"mm": {"k": {}}}})
                 .encode())
    assert TuneStore(tmp_path / "old" / "tune.json", owner="t", device="d").get("mm", "k") is None


def test_an_unwritable_directory_keeps_results_in_memory(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    s = TuneStore(blocker / "dev" / "tune.json", owner="t", device="d")
    s.put("mm", "k", {"tile": 4})
    assert s.get("mm", "k") == {"tile": 4}


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"


def test_threads_storing_at_once_lose_nothing(tmp_path: pathlib.Path) -> None:
    s = store(tmp_path)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(10):
                s.put(f"op{i}", f"k{j}", {"v": i * 10 + j})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    entries = json.loads((tmp_path / "dev" / "tune.json").read_text())["entries"]
    assert {op: len(t) for op, t in entries.items()} == {f"op{i}": 10 for i in range(4)}
