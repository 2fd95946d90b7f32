"""Learner(strategy=...): strategies come from the ember_train.strategies entry points (ember-train imports no
package that provides them); a non-main process writes nothing, records are reduced, forward runs the wrapper."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import numpy as np
import pytest

import ember
from ember import nn
from ember.errors import DTypeError, MissingPluginError, ValueRangeError
from ember_train.data import DataLoader, TensorDataset
from ember_train.learner import STRATEGY_GROUP, Learner, Strategy, resolve_strategy


class Wrapper(nn.Module):
    """Counts the forwards that go through the strategy's module."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: Any) -> Any:
        self.calls += 1
        return self.inner(x)


class OtherRank(Strategy):
    """What a non-main rank of a data-parallel strategy looks like to the Learner."""

    name = "other-rank"
    is_main = False

    def __init__(self) -> None:
        self.reduced = 0
        self.broadcasts: list[Any] = []

    def setup(self, learner: Learner) -> Any:
        self.wrapper = Wrapper(learner.model)
        return self.wrapper

    def reduce_metrics(self, record: dict[str, Any]) -> dict[str, Any]:
        self.reduced += 1
        return {**record, "train_loss": -1.0}

    def broadcast_object(self, obj: Any) -> Any:
        self.broadcasts.append(obj)
        return obj


def _learner(tmp_path: Any, strategy: Any) -> Learner:
    ember.manual_seed(0)
    dev = ember.Device.parse("flex").autodiff()
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    y = np.arange(16) % 3
    model = nn.Linear(4, 3).to(dev)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, device=dev)
    return Learner(model, loader, loss_fn=nn.CrossEntropyLoss(), optimizer=ember.optim.SGD(model.parameters(), lr=0.1),
                   out_dir=tmp_path / "run", dashboard="none", strategy=strategy, best_metric="train_loss",
                   best_mode="min")


def test_non_main_rank_writes_nothing_and_reduces(tmp_path: Any) -> None:
    s = OtherRank()
    learner = _learner(tmp_path, s)
    history = learner.fit(2)
    assert s.wrapper.calls == 8  # 2 epochs x 4 training batches through the strategy's module
    assert s.reduced == 2 and history["train_loss"] == [-1.0, -1.0]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == []  # no checkpoint, log or plot
    assert s.broadcasts[0] is None and isinstance(s.broadcasts[1], str)  # resume path, then the run id


def test_resolve_strategy() -> None:
    assert type(resolve_strategy(None)) is Strategy and resolve_strategy("single").is_main
    s = OtherRank()
    assert resolve_strategy(s) is s
    with pytest.raises(DTypeError, match="strategy must be"):
        resolve_strategy(3)
    with pytest.raises(ValueRangeError, match="unknown strategy 'nope'"):
        resolve_strategy("nope")


def test_missing_ddp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.entry_points

    def without_strategies(**kw: Any) -> Any:
        return [] if kw.get("group") == STRATEGY_GROUP else real(**kw)

    monkeypatch.setattr(metadata, "entry_points", without_strategies)
    with pytest.raises(MissingPluginError, match=r"pip install 'ember\[distributed\]'"):
        resolve_strategy("ddp")
