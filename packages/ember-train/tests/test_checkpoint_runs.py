"""A run owns its checkpoints: run ids in the metadata, rotation of the run's own files only, a folder holding
another run refused unless resumed or overwritten (files moved aside, never deleted), and ``--resume`` picking the
newest checkpoint of the last run."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import ember
from ember import nn, records
from ember_train import checkpoint as ckpt
from ember_train import cli
from ember_train.dashboard import make_dashboard
from ember_train.data import DataLoader, TensorDataset
from ember_train.learner import Learner

DEV = ember.Device.flex().autodiff()


def _learner(out, seed: int = 0) -> Learner:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    ember.manual_seed(seed, DEV)
    model = nn.Linear(3, 2).to(DEV)
    train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, seed=seed, device=DEV)
    return Learner(model, train, loss_fn=nn.CrossEntropyLoss(), optimizer=ember.optim.SGD(model.parameters(), lr=0.1),
                   out_dir=str(out), keep_last=2, dashboard="none", seed=seed)


def _files(d) -> dict[str, float]:
    return {n: os.path.getmtime(os.path.join(d, n)) for n in os.listdir(d) if os.path.isfile(os.path.join(d, n))}


def _epochs(d, run_id=None) -> list[int]:
    return [e for e, _ in ckpt.list_checkpoints(d, run_id)]


def test_checkpoints_carry_the_run_id_and_a_resume_keeps_it(tmp_path):
    first = _learner(tmp_path)
    first.fit(2)
    run = first.run_id
    assert isinstance(run, str) and len(run) == 16
    for name in ("checkpoint-epoch1.safetensors", "checkpoint-epoch2.safetensors", "best.safetensors"):
        assert records.read_metadata(tmp_path / name)["ember_train.run_id"] == run
    again = _learner(tmp_path)
    again.fit(3, resume="latest")
    assert again.run_id == run and _epochs(tmp_path, run) == [2, 3]
    other = _learner(tmp_path / "other")
    other.fit(1)
    assert other.run_id != run  # every fresh run gets a new id
    assert ckpt.checkpoint_run_id(tmp_path / "other" / "checkpoint-epoch1.safetensors") == other.run_id


def test_second_fresh_run_is_refused_and_old_files_survive(tmp_path):
    # the scenario: 4 epochs, then a 2-epoch fresh run in the same folder
    _learner(tmp_path).fit(4)
    before = _files(tmp_path)
    assert _epochs(tmp_path) == [3, 4]
    with pytest.raises(ckpt.RunConflictError) as info:
        _learner(tmp_path, seed=1).fit(2)
    msg = str(info.value)
    assert str(tmp_path) in msg and "already holds checkpoints of another run" in msg
    assert "checkpoint-epoch3.safetensors" in msg and 'resume="latest"' in msg and "overwrite=True" in msg
    assert isinstance(info.value, FileExistsError) and isinstance(info.value, ember.EmberError)
    assert _files(tmp_path) == before  # nothing written, nothing deleted


def test_overwrite_moves_the_old_run_aside_and_rotation_keeps_the_new_one(tmp_path):
    old = _learner(tmp_path)
    old.fit(4)
    new = _learner(tmp_path, seed=1)
    new.fit(2, overwrite=True)
    assert new.run_id != old.run_id
    assert _epochs(tmp_path) == [1, 2] and _epochs(tmp_path, new.run_id) == [1, 2]
    aside = [n for n in os.listdir(tmp_path) if n.startswith("replaced-")]
    assert len(aside) == 1
    moved = os.path.join(tmp_path, aside[0])
    assert {"best.safetensors", "checkpoint-epoch3.safetensors", "checkpoint-epoch4.safetensors", "metrics.jsonl",
            "metrics.csv"} <= set(os.listdir(moved))  # the old run's logs go with it
    assert ckpt.checkpoint_run_id(os.path.join(moved, "checkpoint-epoch4.safetensors")) == old.run_id
    assert ckpt.checkpoint_run_id(tmp_path / "best.safetensors") == new.run_id
    # --resume now continues the new run, not the old one's higher epochs
    assert ckpt.latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-epoch2.safetensors")
    resumed = _learner(tmp_path, seed=1)
    h = resumed.fit(3, resume="latest")
    assert resumed.run_id == new.run_id and len(h) == 3 and _epochs(tmp_path) == [2, 3]


def test_rotation_only_deletes_the_runs_own_checkpoints(tmp_path):
    other = tmp_path / "other"
    _learner(other).fit(1)
    mine = _learner(tmp_path / "mine")
    mine.fit(3)
    foreign = tmp_path / "mine" / "checkpoint-epoch1.safetensors"
    shutil.copy(other / "checkpoint-epoch1.safetensors", foreign)  # another run's file under a name rotation sees
    unreadable = tmp_path / "mine" / "checkpoint-epoch0.safetensors"
    unreadable.write_bytes(b"not a checkpoint")
    assert ckpt.rotate_checkpoints(tmp_path / "mine", 1, mine.run_id) == [
        str(tmp_path / "mine" / "checkpoint-epoch2.safetensors")]
    assert foreign.exists() and unreadable.exists()
    assert _epochs(tmp_path / "mine", mine.run_id) == [3]
    assert ckpt.rotate_checkpoints(tmp_path / "mine", None, mine.run_id) == []


def test_resume_into_a_folder_with_another_runs_files(tmp_path):
    a = _learner(tmp_path)
    a.fit(2)
    b_dir = tmp_path / "b"
    b = _learner(b_dir, seed=1)
    b.fit(1)
    # b's newest checkpoint lands in a's folder under a name a's run also uses: "latest" is the run written last
    shutil.copy(b_dir / "checkpoint-epoch1.safetensors", tmp_path / "checkpoint-epoch1.safetensors")
    assert ckpt.latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-epoch1.safetensors")
    assert ckpt.latest_checkpoint(tmp_path, a.run_id) == str(tmp_path / "checkpoint-epoch2.safetensors")
    before = _files(tmp_path)
    with pytest.raises(ckpt.RunConflictError, match=r"also holds checkpoints of another run.*overwrite=True"):
        _learner(tmp_path, seed=1).fit(2, resume="latest")
    assert _files(tmp_path) == before
    # resuming a's checkpoint by path while b's file is there is refused the same way
    with pytest.raises(ckpt.RunConflictError):
        _learner(tmp_path).fit(3, resume=str(tmp_path / "checkpoint-epoch2.safetensors"))
    resumed = _learner(tmp_path, seed=1)
    resumed.fit(2, resume="latest", overwrite=True)
    assert resumed.run_id == b.run_id
    assert set(ckpt.run_files(tmp_path)) == {b.run_id}


def test_checkpoints_without_a_run_id_are_one_legacy_run(tmp_path):
    _learner(tmp_path).fit(2)
    for _, path in ckpt.list_checkpoints(tmp_path):  # rewrite them as an older ember-train did: no run id
        ckpt.save_checkpoint(path, ckpt.load_checkpoint(path))
    os.remove(tmp_path / "best.safetensors")
    assert ckpt.checkpoint_run_id(tmp_path / "checkpoint-epoch2.safetensors") == ""
    with pytest.raises(ckpt.RunConflictError):
        _learner(tmp_path).fit(2)
    legacy = _learner(tmp_path)
    legacy.fit(3, resume="latest")
    assert legacy.run_id == "" and _epochs(tmp_path, "") == [2, 3]


def test_overwrite_must_be_a_bool(tmp_path):
    with pytest.raises(ember.DTypeError, match="overwrite must be a bool"):
        _learner(tmp_path).fit(1, overwrite="yes")


# -- the command line ------------------------------------------------------------------------------------------
def _train(out, *extra: str) -> list[str]:
    return ["regression-csv", "--quick", "--out", str(out), "--dashboard", "plain", "--device", "flex", *extra]


def test_cli_refuses_a_second_run_then_overwrite_and_resume(tmp_path, capsys):
    out = tmp_path / "R"
    assert cli.main(_train(out, "--epochs", "4")) == 0
    capsys.readouterr()
    before = _files(out)
    assert cli.main(_train(out, "--epochs", "2")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"ember train regression-csv: {out} already holds checkpoints of another run (")
    assert "--resume" in err[1] and "--overwrite" in err[1] and "--out" in err[1]
    assert _files(out) == before  # not even the recipe's data file was rewritten
    assert cli.main(_train(out, "--epochs", "2", "--overwrite")) == 0
    capsys.readouterr()
    assert _epochs(out) == [1, 2]
    aside = [n for n in os.listdir(out) if n.startswith("replaced-")]
    assert len(aside) == 1 and {"checkpoint-epoch3.safetensors", "checkpoint-epoch4.safetensors"} <= set(
        os.listdir(out / aside[0]))
    assert cli.main(_train(out, "--epochs", "2", "--resume")) == 0
    text = capsys.readouterr().out
    assert f"resumed from {out / 'checkpoint-epoch2.safetensors'} (epoch 2)" in text


def test_cli_help_lists_overwrite(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    assert "--overwrite" in capsys.readouterr().out
    assert cli._settings(cli.build_parser().parse_args(["--overwrite"])).overwrite


def test_cli_resume_into_a_folder_with_another_runs_files(tmp_path, capsys):
    out, other = tmp_path / "R", tmp_path / "S"
    assert cli.main(_train(out, "--epochs", "1")) == 0
    assert cli.main(_train(other, "--epochs", "1", "--seed", "1")) == 0
    shutil.copy(other / "checkpoint-epoch1.safetensors", out / "checkpoint-epoch7.safetensors")
    capsys.readouterr()
    assert cli.main(_train(out, "--epochs", "2", "--resume")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert f"{out} also holds checkpoints of another run (" in err[0] and "--overwrite" in err[1]
    assert cli.main(_train(out, "--epochs", "1", "--resume", "--overwrite")) == 0
    text = capsys.readouterr().out
    assert f"resumed from {out / 'checkpoint-epoch7.safetensors'} (epoch 1)" in text  # the run written last


def test_cli_resume_whose_schedule_does_not_fit_the_checkpoint(tmp_path, capsys):
    # one quick epoch is too short for OneCycle (no scheduler is saved); 8 epochs add one whose entries
    # (initial_lr, ...) the checkpoint's optimizer groups lack: a typed refusal before anything is loaded, not a
    # KeyError mid-training
    out = tmp_path / "R"
    assert cli.main(_train(out, "--epochs", "1")) == 0
    capsys.readouterr()
    before = _files(out)
    assert cli.main(_train(out, "--epochs", "8", "--resume")) == 1
    err = capsys.readouterr().err
    assert "InvalidCheckpointError" in err and "checkpoint-epoch1.safetensors" in err
    assert "no scheduler state" in err and "OneCycleLR" in err and "initial_lr" in err
    before.pop("regression.csv")  # the recipe regenerates its (identical) data file before the Learner resumes
    after = _files(out)
    after.pop("regression.csv")
    assert after == before


def test_resume_with_another_seed_says_so(tmp_path, capsys):
    _learner(tmp_path).fit(1)
    other = _learner(tmp_path, seed=3)
    other.dashboard = make_dashboard("plain")
    capsys.readouterr()
    other.fit(2, resume="latest")
    assert "trained with seed 0, this Learner uses seed 3" in capsys.readouterr().out
