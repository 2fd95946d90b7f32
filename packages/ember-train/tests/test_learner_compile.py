"""Learner(compile=True), the default: replayed steps give the eager run bit for bit on flex, resume stays exact,
and a step that cannot replay runs eagerly and says why."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import nn
from ember.errors import DTypeError
from ember_train.dashboard import Dashboard
from ember_train.data import DataLoader, TensorDataset
from ember_train.learner import Learner
from ember_train.models import SeedCNN

DEV = ember.Device.flex().autodiff()


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 12, 12)).astype(np.float32), rng.integers(0, 4, n)


def _build(tmp_path=None, *, compile: bool = True, sched: bool = True, n: int = 40, **kw) -> Learner:
    ember.manual_seed(0, DEV)
    model = SeedCNN(num_classes=4, channels=6, hidden=16, image_size=12).to(DEV)  # conv, BN, GELU, dropout
    opt = ember.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    scheduler = ember.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if sched else None
    x, y = _data(n, 0)
    xv, yv = _data(16, 1)
    train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, seed=5, device=DEV)
    valid = DataLoader(TensorDataset(xv, yv), batch_size=8, device=DEV)
    kw.setdefault("dashboard", "none")
    return Learner(model, train, valid, loss_fn=nn.CrossEntropyLoss(), optimizer=opt, scheduler=scheduler,
                   out_dir=None if tmp_path is None else str(tmp_path), compile=compile, **kw)


def _strip(epochs):
    return [{k: v for k, v in e.items() if k not in ("samples_per_sec", "epoch_time")} for e in epochs]


def _params(learner: Learner) -> list[np.ndarray]:
    m = learner.model
    return [t.numpy().copy() for t in (*m.parameters(), *m.buffers())]


def _same(a: Learner, b: Learner, ha, hb) -> None:
    assert _strip(ha.epochs) == _strip(hb.epochs)
    for u, v in zip(_params(a), _params(b)):
        np.testing.assert_array_equal(u, v)


def test_compiled_fit_is_eager_bit_for_bit():
    eager = _build(compile=False)
    he = eager.fit(2)
    compiled = _build()
    hc = compiled.fit(2)
    _same(eager, compiled, he, hc)
    stats = compiled.compile_stats()
    # 5 steps an epoch: two recordings (Adam's state created, then the steady step), the other 8 replay through
    # the scheduler's lr changes and the epoch's reseeding of the dropout stream
    assert stats["replays"] == 8 and stats["graph_breaks"] == 0 and stats["graphs"] == 1
    assert eager.compile_stats() is None


def test_exact_resume_with_replay(tmp_path):
    straight = _build(tmp_path / "a")
    h3 = straight.fit(3)
    first = _build(tmp_path / "b")
    first.fit(2)
    resumed = _build(tmp_path / "b")
    h = resumed.fit(3, resume="latest")
    _same(straight, resumed, h3, h)
    assert resumed.compile_stats()["replays"] > 0
    eager = _build(tmp_path / "c", compile=False)
    _same(eager, straight, eager.fit(3), h3)


def test_accumulation_and_clipping_replay_like_eager():
    eager = _build(compile=False, grad_accum_steps=2, clip_grad_norm=0.5, n=48)
    compiled = _build(grad_accum_steps=2, clip_grad_norm=0.5, n=48)
    _same(eager, compiled, eager.fit(2), compiled.fit(2))
    assert compiled.compile_stats()["replays"] > 0  # the micro-batch step (forward and backward)


def test_clipping_in_the_compiled_step():
    eager = _build(compile=False, clip_grad_norm=0.25)
    compiled = _build(clip_grad_norm=0.25)
    he, hc = eager.fit(1), compiled.fit(1)
    _same(eager, compiled, he, hc)
    assert hc["grad_norm"] == he["grad_norm"] and compiled.compile_stats()["replays"] == 3


def test_replay_off_by_environment(monkeypatch):
    monkeypatch.setenv("EMBER_REPLAY", "0")
    learner = _build()
    learner.fit(1)
    stats = learner.compile_stats()
    assert stats["replays"] == 0 and stats["recordings"] == 0 and stats["reason"] == "EMBER_REPLAY=0"


class _ReadingLoss(nn.Module):
    """A loss whose value decides a branch inside the step: a graph break on every step."""

    def forward(self, out, y):
        loss = nn.functional.cross_entropy(out, y)
        return loss * 2 if loss.item() > 100 else loss


def test_a_step_that_cannot_replay_runs_eagerly_and_says_why():
    messages: list[str] = []

    class Notes(Dashboard):
        def message(self, text: str) -> None:
            messages.append(text)

    def run(compile: bool) -> Learner:
        learner = _build(compile=compile, sched=False, dashboard=Notes())
        learner.loss_fn = _ReadingLoss()
        learner._compiled_step, learner._compiled_micro = learner._make_steps()
        learner.fit(1)
        return learner

    compiled = run(True)
    stats = compiled.compile_stats()
    assert stats["replays"] == 0 and "reads the value" in stats["reason"]
    said = [m for m in messages if "compile: training steps run eagerly" in m]
    assert len(said) == 1 and "reads the value" in said[0]
    eager = run(False)
    for u, v in zip(_params(eager), _params(compiled)):
        np.testing.assert_array_equal(u, v)


def test_compile_flag_must_be_a_bool():
    with pytest.raises(DTypeError, match="compile"):
        _build(compile="yes")
