"""Learner: loss, accumulation, clipping, schedulers, checkpoints, exact resume, early stop, Ctrl-C, errors."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

import ember
from ember import nn, records
from ember.errors import UnsupportedError, ValueRangeError
from ember_train import checkpoint as ckpt
from ember_train.data import DataLoader, TensorDataset
from ember_train.learner import Callback, History, Learner, OutputDirError

DEV = ember.Device.flex().autodiff()
N_IN, N_CLS = 6, 3


def make_data(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_IN)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64))
    return x, y


def loaders(batch_size: int = 16, shuffle: bool = True, n: int = 96) -> tuple[DataLoader, DataLoader]:
    x, y = make_data(n)
    xv, yv = make_data(48, seed=1)
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, seed=3, device=DEV)
    valid = DataLoader(TensorDataset(xv, yv), batch_size=16, device=DEV)
    return train, valid


class MLP(nn.Module):
    def __init__(self, n_out: int = N_CLS, dropout: float = 0.2) -> None:
        super().__init__()
        self.hidden = nn.Linear(N_IN, 16)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(16, n_out)

    def forward(self, x):
        return self.out(self.drop(nn.functional.relu(self.hidden(x))))


def fresh(n_out: int = N_CLS, dropout: float = 0.2) -> MLP:
    ember.manual_seed(0, DEV)
    return MLP(n_out, dropout).to(DEV)


def build(tmp_path=None, *, model=None, lr: float = 0.1, sched: bool = False, train=None, valid=None, **kw):
    model = model if model is not None else fresh()
    opt = ember.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scheduler = ember.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5) if sched else None
    if train is None:
        train, valid = loaders()
    kw.setdefault("dashboard", "none")
    return Learner(model, train, valid, loss_fn=nn.CrossEntropyLoss(), optimizer=opt, scheduler=scheduler,
                   out_dir=None if tmp_path is None else str(tmp_path), **kw)


def params(model) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def strip_timing(records_: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("samples_per_sec", "epoch_time")} for r in records_]


def test_loss_decreases_and_history(tmp_path):
    learner = build(tmp_path, metrics=("loss", "accuracy", "top2", "f1"))
    h = learner.fit(5)
    assert isinstance(h, History) and len(h) == 5 and not h.interrupted
    assert h["train_loss"][-1] < h["train_loss"][0] * 0.8
    assert h["valid_accuracy"][-1] > 0.6
    for key in ("train_accuracy", "train_top2_accuracy", "train_f1", "valid_f1", "lr", "samples_per_sec"):
        assert key in h
    assert all(a <= b + 1e-12 for a, b in zip(h["train_accuracy"], h["train_top2_accuracy"]))
    assert h.best["metric"] == "valid_accuracy"
    assert h.best_value == max(h["valid_accuracy"])
    assert h["valid_accuracy"][h.best_epoch - 1] == h.best_value
    assert h.elapsed > 0


def test_grad_accumulation_equals_big_batch():
    x, y = make_data(96)
    results = []
    for bs, accum in ((32, 1), (8, 4), (16, 2)):
        train = DataLoader(TensorDataset(x, y), batch_size=bs, device=DEV)
        learner = build(model=fresh(dropout=0.0), train=train, valid=None, grad_accum_steps=accum,
                        best_metric="train_loss", best_mode="min")
        h = learner.fit(2)
        results.append((params(learner.model), h["train_loss"], learner.global_step))
    ref, ref_loss, ref_steps = results[0]
    assert ref_steps == 6  # 96 / 32 per epoch, 2 epochs
    for p, loss, steps in results[1:]:
        assert steps == ref_steps
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        for k in ref:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-4, atol=1e-6)


def test_grad_accumulation_uneven_tail_weights_by_samples():
    # 40 samples in batches of 16: the group of accumulation 3 holds 16 + 16 + 8 = one batch of 40
    x, y = make_data(40)
    out = []
    for bs, accum in ((40, 1), (16, 3)):
        train = DataLoader(TensorDataset(x, y), batch_size=bs, device=DEV)
        learner = build(model=fresh(dropout=0.0), train=train, valid=None, grad_accum_steps=accum)
        learner.fit(1)
        out.append(params(learner.model))
    for k in out[0]:
        np.testing.assert_allclose(out[1][k], out[0][k], rtol=1e-4, atol=1e-6)


def test_gradient_clipping_applied():
    x, y = make_data(32)
    x = x * 100.0  # huge gradients
    train = DataLoader(TensorDataset(x, y), batch_size=32, device=DEV)
    model = fresh(dropout=0.0)
    before = params(model)
    opt = ember.optim.SGD(model.parameters(), lr=1.0)
    learner = Learner(model, train, loss_fn=nn.CrossEntropyLoss(), optimizer=opt, clip_grad_norm=0.01,
                      dashboard="none")
    h = learner.fit(1)
    after = params(model)
    delta = np.sqrt(sum(((after[k] - before[k]) ** 2).sum() for k in before))
    assert delta <= 0.01 * (1 + 1e-4)  # one SGD step of lr 1 moves by the clipped gradient norm
    assert h["grad_norm"][0] > 0.01  # the recorded norm is the one before clipping


@pytest.mark.parametrize(("interval", "expected"), [("step", 2 * 6), ("epoch", 2)])
def test_scheduler_stepping_counts(interval, expected):
    learner = build(sched=True, scheduler_interval=interval)  # 96 / 16 = 6 steps per epoch
    h = learner.fit(2)
    assert learner.scheduler.last_epoch == expected
    assert learner.global_step == 12
    if interval == "epoch":
        assert h["lr"] == [0.1, 0.1]  # StepLR(step_size=4) has not decayed after 2 epoch steps
    else:
        assert h["lr"][1] == pytest.approx(0.1 * 0.5)  # 6 steps in: one decay


def test_checkpoint_rotation_and_best(tmp_path):
    learner = build(tmp_path, keep_last=2, best_metric="valid_loss", best_mode="min")
    h = learner.fit(4)
    names = sorted(os.listdir(tmp_path))
    assert [e for e, _ in ckpt.list_checkpoints(tmp_path)] == [3, 4]
    assert "best.safetensors" in names and "metrics.jsonl" in names and "metrics.csv" in names
    best = ckpt.load_checkpoint(tmp_path / "best.safetensors")
    assert best["epoch"] == h.best_epoch
    assert h.best_value == min(h["valid_loss"])
    assert not [n for n in names if n.endswith(".ember-tmp") or n.startswith(".ember-train-probe")]
    meta = records.read_metadata(tmp_path / "checkpoint-epoch4.safetensors")
    assert meta["ember_train.epoch"] == "4"
    # inference helper loads the weights of a checkpoint into a fresh model
    fresh = MLP().to(DEV)
    assert ckpt.load_model_weights(fresh, tmp_path / "checkpoint-epoch4.safetensors").clean
    for k, v in params(learner.model).items():
        np.testing.assert_array_equal(params(fresh)[k], v)


def test_exact_resume_bit_for_bit(tmp_path):
    straight = build(tmp_path / "a", sched=True)
    h3 = straight.fit(3)
    first = build(tmp_path / "b", sched=True)
    first.fit(2)
    resumed = build(tmp_path / "b", sched=True)  # a fresh process: new model, optimizer, loaders
    h = resumed.fit(3, resume="latest")
    assert len(h) == 3
    assert strip_timing(h.epochs) == strip_timing(h3.epochs)
    a, b = params(straight.model), params(resumed.model)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert resumed.scheduler.last_epoch == straight.scheduler.last_epoch
    assert resumed.global_step == straight.global_step
    # resume from an explicit path works too, and the logs hold all three epochs
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]


def test_resume_latest_without_checkpoint_starts_fresh(tmp_path):
    h = build(tmp_path).fit(1, resume="latest")
    assert len(h) == 1


def test_early_stopping(tmp_path):
    # lr 0 never improves after epoch 1: patience 2 stops after epoch 3
    learner = build(tmp_path, lr=0.0, early_stopping_patience=2, best_metric="valid_loss", best_mode="min")
    h = learner.fit(10)
    assert h.stopped_early and len(h) == 3 and h.best_epoch == 1


class InterruptingLoader:
    """Wraps a loader and raises KeyboardInterrupt at global step ``at``, like Ctrl-C mid-epoch."""

    def __init__(self, inner: DataLoader, at: int) -> None:
        self.inner, self.at, self.count = inner, at, 0

    def __len__(self):
        return len(self.inner)

    def set_epoch(self, e):
        self.inner.set_epoch(e)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, s):
        self.inner.load_state_dict(s)

    def check(self):
        return self.inner.check()

    def __iter__(self):
        for batch in self.inner:
            self.count += 1
            if self.count == self.at:
                raise KeyboardInterrupt
            yield batch


def test_keyboard_interrupt_from_loader(tmp_path, capsys):
    train, valid = loaders()
    learner = build(tmp_path, train=InterruptingLoader(train, at=6 + 3), valid=valid, dashboard="plain")
    h = learner.fit(3)
    assert h.interrupted and len(h) == 1
    assert [e for e, _ in ckpt.list_checkpoints(tmp_path)] == [1]
    out = capsys.readouterr().out
    assert "interrupted" in out and "training interrupted after epoch 1" in out
    # the run continues from the completed checkpoint
    train2, valid2 = loaders()
    h2 = build(tmp_path, train=train2, valid=valid2).fit(2, resume="latest")
    assert len(h2) == 2 and not h2.interrupted


def test_keyboard_interrupt_from_callback(tmp_path):
    class Stop(Callback):
        def on_step_end(self, learner, epoch, step, metrics):
            if epoch == 1 and step == 2:
                raise KeyboardInterrupt

    h = build(tmp_path, callbacks=[Stop()]).fit(4)
    assert h.interrupted and len(h) == 1 and not (tmp_path / "curves.png").exists()


def test_mixed_precision_unsupported_on_flex():
    with pytest.raises(UnsupportedError, match=r"mixed_precision.*flex"):
        build(mixed_precision=True)


def test_labels_out_of_range_caught_before_training():
    x, y = make_data(32)
    y[5] = 7
    train = DataLoader(TensorDataset(x, y), batch_size=32, device=DEV)
    learner = build(train=train, valid=None)
    before = params(learner.model)
    with pytest.raises(ValueRangeError, match=r"range over \[0, 7\].*3 classes.*\[0, 2\]"):
        learner.fit(1)
    assert learner.global_step == 0
    for k, v in params(learner.model).items():
        np.testing.assert_array_equal(v, before[k])


def test_uncollatable_batch_caught_before_training():
    class Ragged:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.zeros(N_IN + (i % 2), np.float32), np.int64(0)

    train = DataLoader(Ragged(), batch_size=4, device=DEV)
    learner = build(train=train, valid=None)
    with pytest.raises(ember.EmberError, match="shape|collate"):
        learner.fit(1)
    assert learner.global_step == 0


def test_checkpoint_from_other_model_names_keys(tmp_path):
    build(tmp_path).fit(1)
    other = build(tmp_path / "other", model=fresh(n_out=5))
    with pytest.raises(records.IncompatibleStateError, match=r"out\.weight.*\[3, 16\].*\[5, 16\]") as info:
        other.fit(2, resume=str(tmp_path / "checkpoint-epoch1.safetensors"))
    assert [k for k, _, _ in info.value.report.mismatched_keys] == ["out.weight", "out.bias"]


def test_unwritable_out_dir(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    learner = build(blocker / "run")
    with pytest.raises(OutputDirError, match="file.txt"):
        learner.fit(1)
    assert learner.global_step == 0


def test_bad_arguments():
    with pytest.raises(ValueRangeError, match="scheduler_interval"):
        build(scheduler_interval="batch")
    with pytest.raises(ValueRangeError, match="grad_accum_steps"):
        build(grad_accum_steps=0)
    with pytest.raises(ValueRangeError, match="unknown metric 'auc'"):
        build(metrics=("loss", "auc"))
    with pytest.raises(ValueRangeError, match="best_metric 'valid_f1'.*available"):
        build(best_metric="valid_f1")
    with pytest.raises(ValueRangeError, match="epochs"):
        build().fit(0)


def test_no_valid_loader_uses_train_metric():
    train, _ = loaders()
    learner = build(train=train, valid=None)
    assert learner.best_metric == "train_accuracy"
    h = learner.fit(1)
    assert h.best["metric"] == "train_accuracy" and "valid_loss" not in h


def test_logs_written_and_parseable(tmp_path):
    h = build(tmp_path, metrics=("loss", "accuracy", "f1")).fit(2)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == h.epochs
    with open(tmp_path / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in table] == [1, 2]
    assert float(table[1]["valid_f1"]) == pytest.approx(h["valid_f1"][1])
    pytest.importorskip("matplotlib")
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_plain_dashboard_output(tmp_path, capsys):
    build(tmp_path, dashboard="plain", log_every=3).fit(2)
    lines = capsys.readouterr().out.splitlines()
    epoch_lines = [line for line in lines if line.startswith("epoch ") and "step" not in line]
    step_lines = [line for line in lines if " step " in line]
    assert len(epoch_lines) == 2 and epoch_lines[0].startswith("epoch 1/2  train_loss ")
    assert "valid_accuracy" in epoch_lines[1] and "samples_per_sec" in epoch_lines[1]
    assert len(step_lines) == 4  # steps 3 and 6 of 6, two epochs
    assert lines[0].startswith("training on flex+autodiff")
    assert lines[-1].startswith("training finished after epoch 2")


def test_auto_dashboard_is_plain_when_not_a_tty(capsys):
    from ember_train.dashboard import PlainDashboard

    assert isinstance(build(dashboard="auto").dashboard, PlainDashboard)


def test_learner_with_rich_dashboard(tmp_path):
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system=None)
    h = build(tmp_path, dashboard="rich", console=console).fit(2)
    out = buf.getvalue()
    assert len(h) == 2 and "training finished after epoch 2" in out and "valid" in out


def test_ctrl_c_during_checkpoint_write_finishes_the_file(tmp_path):
    import signal

    model = fresh()
    path = tmp_path / "c.safetensors"
    real_save = records.save

    def save_with_sigint(obj, p, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C arrives mid-write
        real_save(obj, p, **kw)

    records.save = save_with_sigint
    try:
        with pytest.raises(KeyboardInterrupt):
            ckpt.save_checkpoint(path, {"format": ckpt.FORMAT, "epoch": 1, "model": model.state_dict()})
    finally:
        records.save = real_save
    state = ckpt.load_checkpoint(path)  # complete despite the interrupt
    assert state["epoch"] == 1 and list(state["model"]) == list(model.state_dict())


def test_load_checkpoint_rejects_plain_weights(tmp_path):
    records.save(fresh(), tmp_path / "w.safetensors")
    with pytest.raises(records.RecordError, match="not an ember-train checkpoint"):
        ckpt.load_checkpoint(tmp_path / "w.safetensors")
    assert ckpt.load_model_weights(fresh(), tmp_path / "w.safetensors").clean
