"""Optimizer and scheduler ``load_state_dict``: a damaged state is refused with a ValueRangeError naming the entry,
before anything changes; every genuine state (also after a records round trip) is accepted."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember
from ember import Tensor, nn, records
from ember.errors import ValueRangeError
from ember.optim import SGD, Adagrad, Adam, AdamW, Lion, RMSprop
from ember.optim import lr_scheduler as ls

OPTIMIZERS: list[tuple[str, Callable[[list], Any]]] = [
    ("SGD", lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
    ("Adam-amsgrad", lambda p: Adam(p, lr=0.01, amsgrad=True)),
    ("AdamW", lambda p: AdamW(p, lr=0.01)),
    ("Adagrad", lambda p: Adagrad(p, lr=0.1)),
    ("RMSprop-centered-momentum", lambda p: RMSprop(p, lr=0.01, momentum=0.5, centered=True)),
    ("Lion", lambda p: Lion(p, lr=1e-3)),
]


def _params() -> list[nn.Parameter]:
    rng = np.random.default_rng(0)
    return [nn.Parameter(ember.tensor(rng.normal(size=s).astype(np.float32))) for s in ((3, 2), (2,))]


def _stepped(make: Callable[[list], Any], steps: int = 2) -> Any:
    ps = _params()
    opt = make(ps)
    for i in range(steps):
        for p in ps:
            p.grad = ember.ones(p.shape) * (i + 1)
        opt.step()
    return opt


def _host(x: Any) -> Any:
    if isinstance(x, Tensor):
        return (x.dtype.name, x.numpy().tolist())
    if isinstance(x, dict):
        return {k: _host(v) for k, v in x.items() if k != "params"}
    if isinstance(x, (list, tuple)):
        return [_host(v) for v in x]
    return x


@pytest.mark.parametrize(("name", "make"), OPTIMIZERS, ids=[n for n, _ in OPTIMIZERS])
def test_genuine_states_load_also_after_a_records_round_trip(tmp_path: Path, name: str, make: Callable) -> None:
    src = _stepped(make)
    records.save(src.state_dict(), tmp_path / "o.safetensors")
    loaded = records.load(tmp_path / "o.safetensors")
    dst = _stepped(make, steps=0)
    dst.check_state_dict(loaded)
    dst.load_state_dict(loaded)
    assert _host(dst.state_dict()) == _host(src.state_dict())


def _first(sd: dict) -> dict:
    return sd["state"][0]


TAMPER: list[tuple[str, str, Callable[[dict], None], str]] = [
    # (id, optimizer, change, words the message holds)
    ("lr-nan", "SGD", lambda sd: sd["param_groups"][0].update(lr=math.nan), r"param_groups\[0\]\['lr'\] is nan"),
    ("lr-inf", "Adam-amsgrad", lambda sd: sd["param_groups"][0].update(lr=math.inf), "'lr'.*inf"),
    ("lr-negative", "SGD", lambda sd: sd["param_groups"][0].update(lr=-1.0), r"param_groups\[0\].*learning rate"),
    ("lr-string", "Lion", lambda sd: sd["param_groups"][0].update(lr="1e-3"), "'lr'.*'1e-3'"),
    ("lr-bool", "AdamW", lambda sd: sd["param_groups"][0].update(lr=True), "'lr'.*True"),
    ("lr-missing", "Adagrad", lambda sd: sd["param_groups"][0].pop("lr"), r"\['lr'\] is missing"),
    ("betas-range", "Adam-amsgrad", lambda sd: sd["param_groups"][0].update(betas=(1.0, 0.9)), "betas"),
    ("betas-nan", "Lion", lambda sd: sd["param_groups"][0].update(betas=(0.9, math.nan)), "betas"),
    ("betas-scalar", "AdamW", lambda sd: sd["param_groups"][0].update(betas=0.9), "betas"),
    ("eps-negative", "RMSprop-centered-momentum", lambda sd: sd["param_groups"][0].update(eps=-1e-8), "eps"),
    ("flag-string", "Adam-amsgrad", lambda sd: sd["param_groups"][0].update(amsgrad="no"), "amsgrad"),
    ("nesterov-without-momentum", "SGD", lambda sd: sd["param_groups"][0].update(momentum=0.0), "Nesterov"),
    ("groups-missing", "SGD", lambda sd: sd.pop("param_groups"), "'state' and 'param_groups'"),
    ("groups-not-list", "SGD", lambda sd: sd.update(param_groups="x"), "'param_groups' must be a list"),
    ("group-not-dict", "SGD", lambda sd: sd["param_groups"].__setitem__(0, [1]), r"param_groups\[0\] must be a dict"),
    ("params-missing", "SGD", lambda sd: sd["param_groups"][0].pop("params"), r"\['params'\]"),
    ("params-strings", "SGD", lambda sd: sd["param_groups"][0].update(params=["a", "b"]), r"\['params'\]"),
    ("params-repeated", "SGD", lambda sd: sd["param_groups"][0].update(params=[0, 0]), "repeats"),
    ("params-count", "SGD", lambda sd: sd["param_groups"][0].update(params=[0]), "group 0 has 1 parameters"),
    ("state-not-dict", "SGD", lambda sd: sd.update(state=[1]), "'state' must be a dict"),
    ("state-key", "SGD", lambda sd: sd["state"].update(x={}), "state key 'x'"),
    ("state-entry-not-dict", "SGD", lambda sd: sd["state"].update({0: 5}), r"state\[0\] must be a dict"),
    ("buffer-shape", "SGD", lambda sd: _first(sd).update(momentum_buffer=ember.zeros(2, 3)),
     r"state\[0\]\['momentum_buffer'\] has shape \(2, 3\)"),
    ("buffer-int", "Adam-amsgrad", lambda sd: _first(sd).update(exp_avg=ember.zeros(3, 2, dtype="int64")),
     "exp_avg.*int64"),
    ("buffer-string", "SGD", lambda sd: _first(sd).update(momentum_buffer="zeros"), "momentum_buffer.*'zeros'"),
    ("step-negative", "Adam-amsgrad", lambda sd: _first(sd).update(step=ember.tensor(-1.0)), r"\['step'\] is -1"),
    ("step-nan", "Adagrad", lambda sd: _first(sd).update(step=ember.tensor(math.nan)), "'step'.*nan"),
    ("step-vector", "RMSprop-centered-momentum", lambda sd: _first(sd).update(step=ember.zeros(2)),
     "'step'.*one-element"),
    ("step-number-negative", "AdamW", lambda sd: _first(sd).update(step=-2), "'step'.*-2"),
    ("missing-exp-avg", "Adam-amsgrad", lambda sd: _first(sd).pop("exp_avg"), r"lacks \['exp_avg'\]"),
    ("missing-amsgrad-buffer", "Adam-amsgrad", lambda sd: _first(sd).pop("max_exp_avg_sq"), "max_exp_avg_sq"),
    ("missing-sum", "Adagrad", lambda sd: _first(sd).pop("sum"), r"lacks \['sum'\]"),
    ("missing-grad-avg", "RMSprop-centered-momentum", lambda sd: _first(sd).pop("grad_avg"), "grad_avg"),
    ("renamed-lion-avg", "Lion", lambda sd: _first(sd).update(m=_first(sd).pop("exp_avg")),
     r"lacks \['exp_avg'\] \(has \['m'\]\)"),
]
_MAKE = dict(OPTIMIZERS)


@pytest.mark.parametrize(("case", "name", "change", "words"), TAMPER, ids=[t[0] for t in TAMPER])
def test_damaged_optimizer_state_is_refused_before_anything_changes(case: str, name: str, change: Callable,
                                                                     words: str) -> None:
    sd = _stepped(_MAKE[name]).state_dict()
    bad = copy.copy(sd)
    bad["param_groups"] = [dict(g) for g in sd["param_groups"]]
    bad["state"] = {k: dict(v) for k, v in sd["state"].items()}
    change(bad)
    target = _stepped(_MAKE[name], steps=1)
    before = _host(target.state_dict())
    with pytest.raises(ValueRangeError, match=words) as info:
        target.check_state_dict(bad)
    assert f"{type(target).__name__}.load_state_dict" in str(info.value)
    with pytest.raises(ValueRangeError, match=words):
        target.load_state_dict(bad)
    assert _host(target.state_dict()) == before


def test_unknown_state_indices_are_ignored_like_pytorch() -> None:
    sd = _stepped(_MAKE["SGD"]).state_dict()
    sd["state"][7] = {"momentum_buffer": ember.zeros(9)}
    sd["state"]["1"] = sd["state"].pop(1)  # a JSON-style string index is an index
    opt = _stepped(_MAKE["SGD"], steps=0)
    opt.load_state_dict(sd)
    assert len(opt.state) == 2


# -- schedulers --------------------------------------------------------------------------------------------------
SCHEDULERS: list[tuple[str, Callable[[Any], Any]]] = [
    ("StepLR", lambda o: ls.StepLR(o, step_size=3, gamma=0.5)),
    ("MultiStepLR", lambda o: ls.MultiStepLR(o, [2, 5, 5], gamma=0.5)),
    ("ExponentialLR", lambda o: ls.ExponentialLR(o, 0.9)),
    ("LinearLR", lambda o: ls.LinearLR(o, start_factor=0.25, total_iters=4)),
    ("CosineAnnealingLR", lambda o: ls.CosineAnnealingLR(o, T_max=10)),
    ("CosineAnnealingWarmRestarts", lambda o: ls.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2)),
    ("OneCycleLR", lambda o: ls.OneCycleLR(o, max_lr=0.1, total_steps=30)),
    ("NoamLR", lambda o: ls.NoamLR(o, d_model=16, warmup_steps=4)),
    ("ProductLR", lambda o: ls.ProductLR(o, [ls.LinearLR(o, total_iters=4), ls.ExponentialLR(o, 0.9)])),
]


def _sched(make: Callable, steps: int) -> tuple[Any, Any]:
    opt = SGD(_params(), lr=0.1, momentum=0.9)
    s = make(opt)
    for _ in range(steps):
        opt.step()
        s.step()
    return opt, s


@pytest.mark.parametrize(("name", "make"), SCHEDULERS, ids=[n for n, _ in SCHEDULERS])
def test_scheduler_states_survive_a_records_round_trip(tmp_path: Path, name: str, make: Callable) -> None:
    opt, s = _sched(make, 7)
    records.save({"opt": opt.state_dict(), "sched": s.state_dict()}, tmp_path / "s.safetensors")
    saved = records.load(tmp_path / "s.safetensors")
    opt2, s2 = _sched(make, 0)
    opt2.load_state_dict(saved["opt"])
    s2.check_state_dict(saved["sched"])
    s2.load_state_dict(saved["sched"])
    for _ in range(5):
        opt.step()
        s.step()
        opt2.step()
        s2.step()
        assert s2.get_last_lr() == s.get_last_lr()


SCHED_TAMPER: list[tuple[str, str, Callable[[dict], None], str]] = [
    ("last-epoch-low", "StepLR", lambda sd: sd.update(last_epoch=-3), "'last_epoch' is -3"),
    ("last-epoch-float", "StepLR", lambda sd: sd.update(last_epoch=2.5), "'last_epoch' is 2.5"),
    ("step-count", "ExponentialLR", lambda sd: sd.update(_step_count=-1), "'_step_count' is -1"),
    ("base-lr-nan", "CosineAnnealingLR", lambda sd: sd.update(base_lrs=[math.nan]), r"'base_lrs\[0\]' is nan"),
    ("base-lr-negative", "LinearLR", lambda sd: sd.update(base_lrs=[-0.1]), "learning rates must be >= 0"),
    ("base-lrs-length", "StepLR", lambda sd: sd.update(base_lrs=[0.1, 0.2]), "a list of 1 values"),
    ("gamma-string", "StepLR", lambda sd: sd.update(gamma="0.5"), "'gamma' is '0.5'"),
    ("unexpected-key", "StepLR", lambda sd: sd.update(optimizer=None), r"unexpected \['optimizer'\]"),
    ("missing-key", "NoamLR", lambda sd: sd.pop("warmup_steps"), r"missing \['warmup_steps'\]"),
    ("milestones", "MultiStepLR", lambda sd: sd.update(milestones={"a": 1}), "milestones"),
    ("t-max-zero", "CosineAnnealingLR", lambda sd: sd.update(T_max=0), "no learning rates.*ZeroDivisionError"),
    ("past-total-steps", "OneCycleLR", lambda sd: sd.update(last_epoch=31), "tried to step 31 times"),
    ("phase-key", "OneCycleLR",
     lambda sd: sd.update(_schedule_phases=[(8.0, "x", "y", "z", "w"), (29, "x", "y", "z", "w")]),
     "no learning rates.*KeyError.*'x'"),
    ("member-state", "ProductLR", lambda sd: sd["_schedulers"][1].update(gamma=math.inf),
     r"_schedulers\[1\].*gamma"),
    ("member-count", "ProductLR", lambda sd: sd.update(_schedulers=sd["_schedulers"][:1]),
     "saved state has 1 schedulers"),
]
_SCHED = dict(SCHEDULERS)


@pytest.mark.parametrize(("case", "name", "change", "words"), SCHED_TAMPER, ids=[t[0] for t in SCHED_TAMPER])
def test_damaged_scheduler_state_is_refused_before_anything_changes(case: str, name: str, change: Callable,
                                                                     words: str) -> None:
    _, src = _sched(_SCHED[name], 5)
    bad = copy.deepcopy(src.state_dict())
    change(bad)
    opt, target = _sched(_SCHED[name], 2)
    before = (copy.deepcopy(target.state_dict()), [dict(g, params=None) for g in opt.param_groups])
    with pytest.raises(ValueRangeError, match=words):
        target.load_state_dict(bad)
    assert (target.state_dict(), [dict(g, params=None) for g in opt.param_groups]) == before


def test_scheduler_is_tried_on_the_groups_about_to_be_loaded() -> None:
    # OneCycleLR reads max_lr/min_lr from the optimizer's groups: a checkpoint whose groups lack them is refused
    opt, s = _sched(_SCHED["OneCycleLR"], 3)
    groups = [{k: v for k, v in g.items() if k not in ("params", "max_lr")} for g in opt.param_groups]
    with pytest.raises(ValueRangeError, match="no learning rates.*KeyError.*max_lr"):
        s.check_state_dict(s.state_dict(), groups)
    s.check_state_dict(s.state_dict())  # its own groups are fine
