"""Resume from damaged or tampered checkpoints: every bad file is refused with a typed error naming the file and
the offending key, and nothing (model, optimizer, scheduler, loader, counters, history) changes before the refusal."""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
from ember import Tensor, nn, records
from ember.records import CorruptRecordError, IncompatibleStateError, RecordError
from ember_train import checkpoint as ckpt
from ember_train.data import DataLoader, TensorDataset
from ember_train.learner import Learner

DEV = ember.Device.flex().autodiff()


def _loaders() -> tuple[DataLoader, DataLoader]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, seed=1, device=DEV)
    valid = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16, device=DEV)
    return train, valid


def _learner(out, opt: str = "sgd") -> Learner:
    ember.manual_seed(0, DEV)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(DEV)
    if opt == "sgd":
        optimizer = ember.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        optimizer = ember.optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
    scheduler = ember.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    train, valid = _loaders()
    return Learner(model, train, valid, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=scheduler,
                   out_dir=None if out is None else str(out), dashboard="none")


def _host(x: Any) -> Any:
    if isinstance(x, Tensor):
        return ("tensor", x.dtype.name, x.numpy().copy())
    if isinstance(x, dict):
        return {k: _host(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_host(v) for v in x)
    return copy.deepcopy(x)


def _snapshot(learner: Learner) -> dict[str, Any]:
    opt = learner.optimizer.state_dict()
    opt["param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt["param_groups"]]
    return _host({"model": dict(learner.model.state_dict()), "optimizer": opt,
                  "scheduler": learner.scheduler.state_dict(), "loader": learner.train_loader.state_dict(),
                  "step": learner.global_step, "history": learner.history.epochs, "run": learner.run_id})


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, tuple) and a and a[0] == "tensor":
        assert b[0] == "tensor" and a[1] == b[1], where
        np.testing.assert_array_equal(a[2], b[2], err_msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict[str, str]:
    """A good 2-epoch checkpoint from an SGD run and one from an Adam (amsgrad) run."""
    out = {}
    for opt in ("sgd", "adam"):
        d = tmp_path_factory.mktemp(f"src-{opt}")
        _learner(d, opt).fit(2)
        out[opt] = str(d / "checkpoint-epoch2.safetensors")
    return out


@pytest.fixture
def target(tmp_path):
    """A learner that already trained one epoch (non-trivial state to be kept intact); no out_dir unless asked,
    which keeps the many cases fast (no logs or plots written)."""
    def make(opt: str = "sgd", out: bool = False) -> Learner:
        learner = _learner(tmp_path / f"target-{opt}" if out else None, opt)
        learner.fit(1)
        return learner
    return make


def _tampered(source: str, tmp_path, change: Callable[[dict], None], name: str = "bad.safetensors") -> str:
    state = ckpt.load_checkpoint(source)
    change(state)
    path = str(tmp_path / name)
    ckpt.save_checkpoint(path, state, ckpt.checkpoint_run_id(source) or "")
    return path


def _set(*keys: Any, value: Any) -> Callable[[dict], None]:
    def change(state: dict) -> None:
        d = state
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return change


def _drop(*keys: Any) -> Callable[[dict], None]:
    def change(state: dict) -> None:
        d = state
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return change


def _first_state(state: dict) -> dict:
    return next(iter(state["optimizer"]["state"].values()))


CASES = [
    # (id, optimizer, change, error type, words the message must hold besides the file name)
    ("no-optimizer", "sgd", _drop("optimizer"), ckpt.InvalidCheckpointError, ["optimizer", "missing"]),
    ("no-history", "sgd", _drop("history"), ckpt.InvalidCheckpointError, ["history"]),
    ("no-global-step", "sgd", _drop("global_step"), ckpt.InvalidCheckpointError, ["global_step", "missing"]),
    ("negative-step-count", "sgd", _set("global_step", value=-3), ckpt.InvalidCheckpointError,
     ["global_step", "-3"]),
    ("epoch-as-string", "sgd", _set("epoch", value="2"), ckpt.InvalidCheckpointError, ["epoch", "'2'"]),
    ("lr-nan", "sgd", _set("optimizer", "param_groups", 0, "lr", value=float("nan")), ckpt.InvalidCheckpointError,
     ["optimizer", "lr", "nan"]),
    ("lr-string", "sgd", _set("optimizer", "param_groups", 0, "lr", value="fast"), ckpt.InvalidCheckpointError,
     ["optimizer", "lr", "fast"]),
    ("lr-negative", "sgd", _set("optimizer", "param_groups", 0, "lr", value=-0.5), ckpt.InvalidCheckpointError,
     ["optimizer", "learning rate", "-0.5"]),
    ("momentum-inf", "sgd", _set("optimizer", "param_groups", 0, "momentum", value=float("inf")),
     ckpt.InvalidCheckpointError, ["optimizer", "momentum", "inf"]),
    ("nesterov-string", "sgd", _set("optimizer", "param_groups", 0, "nesterov", value="yes"),
     ckpt.InvalidCheckpointError, ["optimizer", "nesterov"]),
    ("no-lr", "sgd", _drop("optimizer", "param_groups", 0, "lr"), ckpt.InvalidCheckpointError,
     ["optimizer", "'lr'", "missing"]),
    ("no-params", "sgd", _drop("optimizer", "param_groups", 0, "params"), ckpt.InvalidCheckpointError,
     ["optimizer", "params"]),
    ("groups-not-a-list", "sgd", _set("optimizer", "param_groups", value={"a": 1}), ckpt.InvalidCheckpointError,
     ["optimizer", "param_groups"]),
    ("state-key-not-an-index", "sgd",
     lambda s: s["optimizer"]["state"].__setitem__("abc", {}), ckpt.InvalidCheckpointError,
     ["optimizer", "'abc'"]),
    ("momentum-buffer-wrong-shape", "sgd",
     lambda s: _first_state(s).__setitem__("momentum_buffer", ember.zeros(3, 3)), ckpt.InvalidCheckpointError,
     ["optimizer", "momentum_buffer", "(3, 3)"]),
    ("momentum-buffer-integer", "sgd",
     lambda s: _first_state(s).__setitem__("momentum_buffer",
                                           ember.zeros(*_first_state(s)["momentum_buffer"].shape, dtype="int64")),
     ckpt.InvalidCheckpointError, ["optimizer", "momentum_buffer", "int64"]),
    ("adam-negative-step", "adam", lambda s: _first_state(s).__setitem__("step", ember.tensor(-4.0)),
     ckpt.InvalidCheckpointError, ["optimizer", "step", "-4"]),
    ("adam-nan-step", "adam", lambda s: _first_state(s).__setitem__("step", ember.tensor(float("nan"))),
     ckpt.InvalidCheckpointError, ["optimizer", "step", "nan"]),
    ("adam-no-exp-avg", "adam", lambda s: _first_state(s).pop("exp_avg"), ckpt.InvalidCheckpointError,
     ["optimizer", "exp_avg"]),
    ("adam-amsgrad-without-its-buffer", "adam", lambda s: _first_state(s).pop("max_exp_avg_sq"),
     ckpt.InvalidCheckpointError, ["optimizer", "max_exp_avg_sq"]),
    ("adam-betas-out-of-range", "adam", _set("optimizer", "param_groups", 0, "betas", value=(0.9, 1.5)),
     ckpt.InvalidCheckpointError, ["optimizer", "betas", "1.5"]),
    ("adam-betas-wrong-length", "adam", _set("optimizer", "param_groups", 0, "betas", value=(0.9,)),
     ckpt.InvalidCheckpointError, ["optimizer", "betas"]),
    ("scheduler-last-epoch", "sgd", _set("scheduler", "last_epoch", value=-5), ckpt.InvalidCheckpointError,
     ["scheduler", "last_epoch", "-5"]),
    ("scheduler-base-lr-nan", "sgd", _set("scheduler", "base_lrs", value=[float("nan")]),
     ckpt.InvalidCheckpointError, ["scheduler", "base_lrs", "nan"]),
    ("scheduler-foreign-attribute", "sgd", _set("scheduler", "optimizer", value=1), ckpt.InvalidCheckpointError,
     ["scheduler", "unexpected", "optimizer"]),
    ("scheduler-gamma-string", "sgd", _set("scheduler", "gamma", value="half"), ckpt.InvalidCheckpointError,
     ["scheduler", "gamma"]),
    ("scheduler-no-step-size", "sgd", _drop("scheduler", "step_size"), ckpt.InvalidCheckpointError,
     ["scheduler", "missing", "step_size"]),
    ("loader-position-string", "sgd", _set("train_loader", "position", value="x"), ckpt.InvalidCheckpointError,
     ["train_loader.position"]),
    ("loader-position-past-end", "sgd", _set("train_loader", "position", value=99), ckpt.InvalidCheckpointError,
     ["train_loader.position", "99"]),
    ("loader-no-seed", "sgd", _drop("train_loader", "seed"), ckpt.InvalidCheckpointError, ["train_loader.seed"]),
    ("history-record-missing", "sgd", lambda s: s["history"]["epochs"].pop(), ckpt.InvalidCheckpointError,
     ["history.epochs", "epoch 2"]),
    ("history-best-epoch-out-of-range", "sgd", _set("history", "best_epoch", value=7), ckpt.InvalidCheckpointError,
     ["history.best_epoch", "7"]),
    ("history-metric-string", "sgd", lambda s: s["history"]["epochs"][0].__setitem__("train_loss", "low"),
     ckpt.InvalidCheckpointError, ["history.epochs[0].train_loss"]),
    ("model-weight-wrong-shape", "sgd", _set("model", "0.weight", value=ember.zeros(8, 5)), IncompatibleStateError,
     ["0.weight", "[8, 5]", "[8, 4]"]),
    ("model-key-missing", "sgd", _drop("model", "2.bias"), IncompatibleStateError, ["missing", "2.bias"]),
    ("model-weight-integer", "sgd", _set("model", "0.weight", value=ember.zeros(8, 4, dtype="int32")),
     ckpt.InvalidCheckpointError, ["0.weight", "int32"]),
    ("model-entry-not-a-tensor", "sgd", _set("model", "0.bias", value=3.0), ckpt.InvalidCheckpointError,
     ["0.bias", "float"]),
    ("model-not-a-dict", "sgd", _set("model", value=[1, 2]), ckpt.InvalidCheckpointError, ["'model'", "list"]),
]


@pytest.mark.parametrize(("name", "opt", "change", "error", "words"), CASES, ids=[c[0] for c in CASES])
def test_tampered_checkpoint_is_refused_and_changes_nothing(source, target, tmp_path, name, opt, change, error,
                                                            words):
    bad = _tampered(source[opt], tmp_path, change)
    learner = target(opt)
    before = _snapshot(learner)
    with pytest.raises(error) as info:
        learner.fit(3, resume=bad)
    message = str(info.value)
    assert bad in message, message
    for w in words:
        assert w in message, (w, message)
    assert isinstance(info.value, RecordError) and isinstance(info.value, ValueError)
    if isinstance(info.value, ckpt.InvalidCheckpointError):
        assert info.value.path == bad and info.value.key
    _assert_same(before, _snapshot(learner))


def test_untampered_copy_resumes(source, target, tmp_path):
    # the control: the same rewrite without a change is accepted and restores the checkpoint's state
    good = _tampered(source["adam"], tmp_path, lambda s: None, "good.safetensors")
    learner = target("adam", out=True)
    with pytest.raises(ckpt.RunConflictError, match="also holds checkpoints of another run"):
        learner.fit(2, resume=good)  # the target folder holds the learner's own earlier run
    h = learner.fit(2, resume=good, overwrite=True)
    assert len(h) == 2 and learner.global_step == ckpt.load_checkpoint(good)["global_step"]
    assert learner.run_id == ckpt.checkpoint_run_id(source["adam"])
    aside = [n for n in os.listdir(learner.out_dir) if n.startswith("replaced-")]
    assert len(aside) == 1 and "checkpoint-epoch1.safetensors" in os.listdir(os.path.join(learner.out_dir, aside[0]))


def _deep_file(tmp_path, depth: int) -> str:
    from safetensors.numpy import save_file

    path = str(tmp_path / f"deep{depth}.safetensors")
    structure = f'{{"format": "{ckpt.FORMAT}", "model": {"[" * depth + "]" * depth}}}'
    save_file({"w": np.ones(2, np.float32)}, path, metadata={
        "ember.kind": "nested", "ember.structure": structure, "ember.version": "1",
        "ember_train.format": ckpt.FORMAT})
    return path


@pytest.mark.parametrize("kind", ["deep", "truncated", "text", "empty", "torch-pickle"])
def test_unreadable_files_are_corrupt_record_errors(source, target, tmp_path, kind):
    path = str(tmp_path / f"{kind}.safetensors")
    if kind == "deep":
        path = _deep_file(tmp_path, 200_000)
    elif kind == "truncated":
        data = open(source["sgd"], "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    elif kind == "text":
        open(path, "w").write("epoch = 3\nlr = 0.1\n")
    elif kind == "empty":
        open(path, "wb").close()
    else:
        torch = pytest.importorskip("torch")
        torch.save({"model": torch.ones(2)}, path)
    learner = target()
    before = _snapshot(learner)
    with pytest.raises(CorruptRecordError) as info:
        learner.fit(3, resume=path)
    assert path in str(info.value)
    _assert_same(before, _snapshot(learner))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    weights = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    for fn in (ckpt.load_checkpoint, records.load, lambda p: ckpt.load_model_weights(model, p),
               lambda p: records.load_into(model, p)):
        with pytest.raises(CorruptRecordError, match=re.escape(path)):
            fn(path)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), weights[k])


def test_deep_nesting_message_names_the_depth(tmp_path):
    path = _deep_file(tmp_path, 5000)
    with pytest.raises(CorruptRecordError, match=r"nested 5001 levels deep, more than the 64"):
        ckpt.load_checkpoint(path)


def test_foreign_loader_refusal_is_typed_and_applied_first(source, tmp_path):
    """A loader of unknown type is validated by its own load_state_dict, which runs before anything else."""
    class Picky:
        def __init__(self, inner: DataLoader) -> None:
            self.inner = inner

        def __len__(self) -> int:
            return len(self.inner)

        def __iter__(self):
            return iter(self.inner)

        def check(self):
            return self.inner.check()

        def state_dict(self):
            return self.inner.state_dict()

        def load_state_dict(self, s):
            raise KeyError("cursor")

    learner = _learner(tmp_path / "picky")
    learner.train_loader = Picky(learner.train_loader)
    learner.fit(1)
    before = _snapshot(learner)
    files = sorted(os.listdir(learner.out_dir))
    with pytest.raises(ckpt.InvalidCheckpointError, match=r"train_loader.*KeyError.*cursor") as info:
        learner.fit(3, resume=source["sgd"], overwrite=True)
    assert info.value.key == "train_loader"
    _assert_same(before, _snapshot(learner))
    assert sorted(os.listdir(learner.out_dir)) == files  # nothing was moved aside for a resume that failed
