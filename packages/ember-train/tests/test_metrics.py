"""Metrics against scikit-learn / numpy oracles, and their error paths."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import f1_score as sk_f1
from sklearn.metrics import top_k_accuracy_score

import ember
from ember.errors import ShapeError, ValueRangeError
from ember_train.metrics import (
    EpochMetrics,
    RunningAverage,
    Throughput,
    accuracy,
    f1_score,
    learning_rate,
    metric_names,
    parse_metric,
    top_k_accuracy,
)

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(200, 5)).astype(np.float32)
TARGETS = RNG.integers(0, 5, size=200)


def test_accuracy_matches_numpy_and_takes_tensors():
    expected = float((LOGITS.argmax(1) == TARGETS).mean())
    assert accuracy(LOGITS, TARGETS) == pytest.approx(expected)
    assert accuracy(ember.tensor(LOGITS), ember.tensor(TARGETS)) == pytest.approx(expected)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_matches_sklearn(k):
    expected = top_k_accuracy_score(TARGETS, LOGITS, k=k, labels=np.arange(5))
    assert top_k_accuracy(LOGITS, TARGETS, k=k) == pytest.approx(expected)


def test_top_k_at_least_classes_is_one():
    assert top_k_accuracy(LOGITS, TARGETS, k=9) == 1.0


def test_f1_macro_matches_sklearn():
    pred = LOGITS.argmax(1)
    assert f1_score(LOGITS, TARGETS) == pytest.approx(sk_f1(TARGETS, pred, average="macro"))
    # labels absent from both targets and predictions are left out, as scikit-learn does
    y = np.array([0, 0, 2, 2, 2])
    p = np.array([0, 2, 2, 2, 0])
    assert f1_score(p, y) == pytest.approx(sk_f1(y, p, average="macro"))


def test_sequence_logits_class_dim_1():
    lg = RNG.normal(size=(4, 3, 7)).astype(np.float32)  # (N, C, L) like cross_entropy
    tg = RNG.integers(0, 3, size=(4, 7))
    assert accuracy(lg, tg) == pytest.approx(float((lg.argmax(1) == tg).mean()))


def test_errors():
    with pytest.raises(ShapeError, match=r"targets of shape \(3,\) do not match logits of shape \(200, 5\)"):
        accuracy(LOGITS, TARGETS[:3])
    with pytest.raises(ShapeError, match=r"expected logits of shape \(N, C\)"):
        accuracy(LOGITS[:, 0], TARGETS)
    with pytest.raises(ValueRangeError, match="k must be a positive int"):
        top_k_accuracy(LOGITS, TARGETS, k=0)
    with pytest.raises(ValueRangeError, match=r"targets range over \[0, 7\], expected 0..4"):
        f1_score(LOGITS, np.where(TARGETS == 4, 7, TARGETS))
    with pytest.raises(ValueRangeError, match="unknown metric 'auc'"):
        parse_metric("auc")


def test_parse_metric_names():
    assert parse_metric("top5") == ("topk", 5)
    assert parse_metric("top3_accuracy") == ("topk", 3)
    assert parse_metric("f1") == ("f1", 0)
    assert metric_names(["loss", "accuracy", "top2", "f1"], "valid") == [
        "valid_loss", "valid_accuracy", "valid_top2_accuracy", "valid_f1"]


def test_epoch_metrics_accumulates_exactly():
    m = EpochMetrics(["loss", "accuracy", "top2", "f1"])
    losses = []
    for i in range(0, 200, 64):  # uneven last batch
        lg, tg = LOGITS[i:i + 64], TARGETS[i:i + 64]
        loss = float(i + 1)
        losses += [loss] * len(tg)
        m.update(loss, len(tg), lg, tg)
    out = m.compute("train")
    assert out["train_loss"] == pytest.approx(np.mean(losses))
    assert out["train_accuracy"] == pytest.approx(accuracy(LOGITS, TARGETS))
    assert out["train_top2_accuracy"] == pytest.approx(top_k_accuracy(LOGITS, TARGETS, 2))
    assert out["train_f1"] == pytest.approx(f1_score(LOGITS, TARGETS))


def test_epoch_metrics_regression_only_loss():
    m = EpochMetrics(["loss", "accuracy"])
    m.update(0.5, 4, np.zeros((4, 1), np.float32), np.zeros((4, 1), np.float32))
    assert m.compute("valid") == {"valid_loss": 0.5}


def test_running_average_throughput_lr():
    r = RunningAverage()
    assert np.isnan(r.value)
    r.update(1.0, 3)
    r.update(3.0, 1)
    assert r.value == pytest.approx(1.5)
    t = Throughput()
    t.update(100)
    assert t.value > 0 and t.samples == 100
    p = ember.zeros(2, requires_grad=True)
    assert learning_rate(ember.optim.SGD([p], lr=0.25)) == 0.25


def test_evaluate_accuracy_over_a_loader_matches_the_batches() -> None:
    import ember
    from ember import nn
    from ember_train.data import DataLoader, TensorDataset
    from ember_train.metrics import evaluate_accuracy

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 4)).astype(np.float32)
    y = rng.integers(0, 3, 50)
    model = nn.Linear(4, 3)
    model.train()
    loader = DataLoader(TensorDataset(ember.tensor(x), ember.tensor(y)), batch_size=16)
    with ember.no_grad():
        want = float((model(ember.tensor(x)).numpy().argmax(axis=1) == y).mean())
    assert evaluate_accuracy(model, loader) == pytest.approx(want)
    assert not model.training  # evaluated in eval mode
    assert evaluate_accuracy(model, []) == 0.0
    with pytest.raises(ember.ShapeError, match="evaluate_accuracy"):
        evaluate_accuracy(model, [(ember.tensor(x), ember.tensor(y[:10]))])
