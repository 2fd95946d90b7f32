"""DistributedDataParallel on 2 ranks equals 1-rank training on the combined batch; unused parameters, buffers,
a killed rank and the launcher (real ``mpiexec -n 2`` subprocesses on localhost)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ember.errors import ValueRangeError

# the shared helpers load by path: the tests run under --import-mode=importlib (no sys.path entry)
_spec = importlib.util.spec_from_file_location("ember_distributed_test_helpers",
                                               Path(__file__).with_name("dist_helpers.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
check = _helpers.check
mpiexec = _helpers.mpiexec
run_ranks = _helpers.run_ranks
worker_module = _helpers.worker_module


def _compare(out, kind: str, steps: int, batch: int, accumulate: int) -> None:
    w = worker_module()
    model = w.train(kind, steps, batch, 1, 0, False, accumulate=accumulate)
    ref = {k: v.numpy() for k, v in model.state_dict().items()}
    for r in range(2):
        got = np.load(out / f"ddp-{kind}-rank{r}.npz")
        for k, v in ref.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {k}")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("training")
    check(run_ranks(2, "training", str(out), timeout=150))
    return out


def test_ddp_mlp_matches_one_process(trained: Path) -> None:
    # 4 steps of 10 samples, several small buckets: the wrap broadcasts rank 0's init (rank 1 starts shifted)
    _compare(trained, "mlp", 4, 10, 1)


def test_ddp_cnn_uneven_batch_and_no_sync(trained: Path) -> None:
    # global batch 9 over 2 ranks (4 + 5 samples), 2 micro-batches per step with no_sync for the first
    _compare(trained, "cnn", 3, 9, 2)


def test_unused_parameters_and_buffers(trained: Path) -> None:
    for r in range(2):
        d = np.load(trained / f"unused-rank{r}.npz")
        msg = str(d["findFalse"])
        assert msg.startswith("DistributedError") and "m.unused.weight" in msg and "find_unused_parameters" in msg
        assert str(d["findTrue"]) == "ok"
        # x = rank + 1 on 2 rows: local grads 2 and 4, averaged 3, accumulated over two backward passes
        np.testing.assert_array_equal(d["gradTrue"], np.full((2, 4), 6.0, np.float32))
        assert bool(d["unused_grad_is_noneTrue"])
        # used by rank 0 only (2 rows of ones): rank 0's gradient 2, averaged with rank 1's nothing
        np.testing.assert_array_equal(d["branch_grad"], np.full((2, 4), 1.0, np.float32))
        np.testing.assert_array_equal(d["branch_bias_grad"], np.full(2, 1.0, np.float32))
        np.testing.assert_array_equal(d["bn_mean_after_wrap"], np.full(3, 5.0, np.float32))
        np.testing.assert_array_equal(d["bn_mean_eval"], np.full(3, 7.0 + r, np.float32))
        np.testing.assert_allclose(d["bn_mean_train"], np.full(3, 6.3, np.float32), rtol=1e-6)


def test_killed_rank_raises_typed_error_within_timeout(tmp_path) -> None:
    mpiexec()
    t0 = time.monotonic()
    launcher = [sys.executable, "-m", "ember_distributed.launch", "-n", "2", "--timeout", "5", "--"]
    proc = run_ranks(2, "killed", str(tmp_path), timeout=80, launcher=launcher, env={"WORKER_TIMEOUT": "5"})
    took = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "RESULT DistributedTimeoutError" in text, text[-3000:]
    assert "did not complete within 5 s" in text
    assert took < 60, f"the survivor took {took:.0f} s to fail"


def test_uncaught_exception_aborts_the_job(tmp_path) -> None:
    mpiexec()
    t0 = time.monotonic()
    launcher = [sys.executable, "-m", "ember_distributed.launch", "-n", "2", "--"]
    proc = run_ranks(2, "crash", str(tmp_path), timeout=50, launcher=launcher)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "ValueError: a bug on rank 1" in text, text[-3000:]
    assert "RESULT rank 0 finished" not in text
    assert time.monotonic() - t0 < 45  # the other rank's collective would wait 60 s


def test_launch_command_line() -> None:
    from ember_distributed.launch import build_command

    exe = mpiexec()
    assert build_command(4, ["--", "python", "t.py"], exe, "mpich") == [exe, "-n", "4", "-disable-auto-cleanup",
                                                                       "python", "t.py"]
    assert build_command(1, ["python", "t.py"], exe, "openmpi") == [exe, "-n", "1", "python", "t.py"]
    with pytest.raises(ValueRangeError, match="command"):
        build_command(2, ["--"], exe, "mpich")
    with pytest.raises(ValueRangeError, match="-n"):
        build_command(0, ["python"], exe, "mpich")


def test_ember_launch_subcommand(capsys) -> None:
    from ember.cli import main

    mpiexec()
    assert main(["launch", "-n", "3", "--dry-run", "--", "python", "train.py"]) == 0
    out = capsys.readouterr().out
    assert " -n 3 " in out and out.strip().endswith("python train.py")


def test_learner_ddp_with_resume_matches_one_process(tmp_path) -> None:
    # 2 ranks x batch 6, 2 epochs, then a new Learner resumes to epoch 3 == one process, batch 12, 3 epochs
    pytest.importorskip("ember_train", reason="the Learner strategy test needs ember-train")
    check(run_ranks(2, "learner", str(tmp_path), timeout=150))
    w = worker_module()
    model, history = w.fit_learner(str(tmp_path / "single"), 3, 12, None)
    ref = {k: v.numpy() for k, v in model.state_dict().items()}
    for r in range(2):
        got = np.load(tmp_path / f"learner-rank{r}.npz")
        for k, v in ref.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {k}")
        np.testing.assert_allclose(got["__train_loss"], history["train_loss"], rtol=1e-5)
        np.testing.assert_allclose(got["__valid_accuracy"], history["valid_accuracy"])
    run = tmp_path / "run"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3  # rank 0's log, written once per epoch
    assert (run / "checkpoint-epoch3.safetensors").exists()
    assert "checkpoint-epoch2.safetensors" in np.load(tmp_path / "learner-rank0.npz")["__files_after_2"].tolist()
