"""ember.optim.lr_scheduler against torch.optim.lr_scheduler: the learning-rate sequence over dozens of steps."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest

import ember
from ember import nn
from ember.optim import SGD, Adam
from ember.optim import lr_scheduler as ls

torch = pytest.importorskip("torch")
tls = torch.optim.lr_scheduler

STEPS = 60
LRS = (0.1, 0.02)


def _pair(opt: str = "SGD", **kw: object) -> tuple[object, object]:
    e = [{"params": [nn.Parameter(ember.zeros(2))], "lr": LRS[0]}, {"params": [nn.Parameter(ember.zeros(2))]}]
    t = [{"params": [torch.zeros(2, requires_grad=True)], "lr": LRS[0]},
         {"params": [torch.zeros(2, requires_grad=True)]}]
    if opt == "SGD":
        return SGD(e, lr=LRS[1], momentum=0.9, **kw), torch.optim.SGD(t, lr=LRS[1], momentum=0.9, **kw)
    return Adam(e, lr=LRS[1], **kw), torch.optim.Adam(t, lr=LRS[1], **kw)


def _sequence(opt: object, sched: object, steps: int = STEPS, keys: tuple[str, ...] = ()) -> list:
    out = []
    for _ in range(steps):
        row = [g["lr"] for g in opt.param_groups]
        for k in keys:
            for g in opt.param_groups:
                row += list(g[k]) if isinstance(g[k], tuple) else [g[k]]
        out.append(row)
        opt.step()
        sched.step()
        assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
    return out


def _compare(name: str, kwargs: dict, steps: int = STEPS, opt: str = "SGD", keys: tuple[str, ...] = (),
             rtol: float = 1e-12) -> list:
    eo, to = _pair(opt)
    es = getattr(ls, name)(eo, **kwargs)
    ts = getattr(tls, name)(to, **kwargs)
    ev, tv = _sequence(eo, es, steps, keys), _sequence(to, ts, steps, keys)
    for i, (a, b) in enumerate(zip(ev, tv)):
        np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol, atol=1e-15,
                                   err_msg=f"{name}{kwargs} at step {i}")
    return ev


CASES = [
    ("StepLR", {"step_size": 7}),
    ("StepLR", {"step_size": 3, "gamma": 0.5}),
    ("MultiStepLR", {"milestones": [5, 20, 20, 41]}),
    ("MultiStepLR", {"milestones": [30, 10], "gamma": 0.3}),
    ("ExponentialLR", {"gamma": 0.95}),
    ("CosineAnnealingLR", {"T_max": 50}),
    ("CosineAnnealingLR", {"T_max": 20, "eta_min": 1e-3}),  # past T_max the cosine rises again
    ("CosineAnnealingLR", {"T_max": 7, "eta_min": 1e-4}),
    ("CosineAnnealingWarmRestarts", {"T_0": 10}),
    ("CosineAnnealingWarmRestarts", {"T_0": 3, "T_mult": 2, "eta_min": 1e-3}),
    ("CosineAnnealingWarmRestarts", {"T_0": 1, "T_mult": 3}),
    ("LinearLR", {}),
    ("LinearLR", {"start_factor": 0.01, "total_iters": 25}),
    ("LinearLR", {"start_factor": 1.0, "end_factor": 0.1, "total_iters": 40}),
    ("LambdaLR", {"lr_lambda": lambda e: 0.97**e + 0.01 * (e % 4)}),
    ("LambdaLR", {"lr_lambda": [lambda e: 1 / (e + 1), lambda e: min(1.0, (e + 1) / 10)]}),
]


# ids stable across processes (xdist)
@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(CASES)])
def test_matches_torch(name: str, kwargs: dict) -> None:
    ev = _compare(name, kwargs)
    assert len({round(v[0], 12) for v in ev}) > 1  # the schedule actually moved


ONECYCLE = [
    {"max_lr": 0.5, "total_steps": STEPS},
    {"max_lr": [0.5, 0.05], "epochs": 6, "steps_per_epoch": 10, "pct_start": 0.25, "anneal_strategy": "linear"},
    {"max_lr": 1.0, "total_steps": STEPS, "three_phase": True, "div_factor": 10.0, "final_div_factor": 100.0},
    {"max_lr": 1.0, "total_steps": STEPS, "three_phase": True, "anneal_strategy": "linear",
     "base_momentum": 0.8, "max_momentum": [0.9, 0.99]},
]


@pytest.mark.parametrize("kwargs", ONECYCLE)
def test_onecycle_matches_torch_lr_and_momentum(kwargs: dict) -> None:
    _compare("OneCycleLR", kwargs, steps=STEPS - 1, keys=("momentum",))


def test_onecycle_cycles_adam_betas() -> None:
    ev = _compare("OneCycleLR", {"max_lr": 0.01, "total_steps": 40}, steps=39, opt="Adam", keys=("betas",))
    assert ev[0][2:] == [0.95, 0.999, 0.95, 0.999]
    assert min(v[2] for v in ev) == pytest.approx(0.85, abs=1e-3)


def test_onecycle_without_momentum_cycling() -> None:
    _compare("OneCycleLR", {"max_lr": 0.3, "total_steps": 30, "cycle_momentum": False}, steps=29, keys=("momentum",))


def test_onecycle_errors() -> None:
    eo, _ = _pair()
    with pytest.raises(ember.ValueRangeError, match="total_steps OR"):
        ls.OneCycleLR(eo, max_lr=0.1)
    with pytest.raises(ember.ValueRangeError, match="positive integer total_steps"):
        ls.OneCycleLR(eo, max_lr=0.1, total_steps=0)
    with pytest.raises(ember.ValueRangeError, match="pct_start"):
        ls.OneCycleLR(eo, max_lr=0.1, total_steps=10, pct_start=1.5)
    with pytest.raises(ember.ValueRangeError, match="anneal_strategy"):
        ls.OneCycleLR(eo, max_lr=0.1, total_steps=10, anneal_strategy="step")
    with pytest.raises(ember.ValueRangeError, match="expected 2 values for max_lr"):
        ls.OneCycleLR(eo, max_lr=[0.1], total_steps=10)
    s = ls.OneCycleLR(eo, max_lr=0.1, total_steps=3)
    s.step()
    s.step()
    s.step()
    with pytest.raises(ember.ValueRangeError, match="tried to step 4 times.*total steps is 3"):
        s.step()


def test_onecycle_needs_momentum_or_betas() -> None:
    from ember.optim import Adagrad

    with pytest.raises(ember.ValueRangeError, match="must support momentum or beta1"):
        ls.OneCycleLR(Adagrad([nn.Parameter(ember.zeros(1))]), max_lr=0.1, total_steps=10)


def test_noam_matches_formula_and_torch_lambda() -> None:
    d_model, warmup, factor = 512, 10, 2.0
    eo, to = _pair("Adam")
    es = ls.NoamLR(eo, d_model=d_model, warmup_steps=warmup, factor=factor)
    for g in to.param_groups:
        g["lr"] = 1.0
    ts = tls.LambdaLR(to, lambda e: factor * d_model**-0.5 * min((e + 1) ** -0.5, (e + 1) * warmup**-1.5))
    ev, tv = _sequence(eo, es, 40), _sequence(to, ts, 40)
    np.testing.assert_allclose(ev, tv, rtol=1e-14)
    lrs = [v[0] for v in ev]
    peak = int(np.argmax(lrs))
    assert peak == warmup - 1  # warm-up peaks at step == warmup_steps, then decays as step**-0.5
    assert lrs[peak] == pytest.approx(factor * d_model**-0.5 * warmup**-0.5)
    assert lrs[0] == pytest.approx(factor * d_model**-0.5 * warmup**-1.5)
    assert lrs[39] == pytest.approx(factor * d_model**-0.5 * 40**-0.5)


def test_noam_errors() -> None:
    eo, _ = _pair()
    with pytest.raises(ember.ValueRangeError, match="NoamLR: d_model"):
        ls.NoamLR(eo, d_model=0, warmup_steps=10)
    with pytest.raises(ember.ValueRangeError, match="NoamLR: warmup_steps"):
        ls.NoamLR(eo, d_model=8, warmup_steps=-1)


@pytest.mark.parametrize("second", [("ExponentialLR", {"gamma": 0.9}), ("CosineAnnealingLR", {"T_max": 100}),
                                    ("StepLR", {"step_size": 6, "gamma": 0.5})])
def test_product_matches_torch_chained(second: tuple) -> None:
    eo, to = _pair()
    name, kw = second
    es = ls.ProductLR(eo, [ls.LinearLR(eo, start_factor=0.1, total_iters=10), getattr(ls, name)(eo, **kw)])
    ts = tls.ChainedScheduler([tls.LinearLR(to, start_factor=0.1, total_iters=10), getattr(tls, name)(to, **kw)])
    ev, tv = _sequence(eo, es, 40), _sequence(to, ts, 40)
    np.testing.assert_allclose(ev, tv, rtol=1e-12)


def test_product_is_product_of_factors() -> None:
    eo, _ = _pair()
    warm = ls.LinearLR(eo, start_factor=0.2, total_iters=5)
    cos = ls.CosineAnnealingWarmRestarts(eo, T_0=4, T_mult=2, eta_min=0.001)
    prod = ls.ProductLR(eo, [warm, cos])
    for e in range(30):
        lin = 0.2 + 0.8 * min(5, e) / 5
        t_cur, t_i = e, 4
        while t_cur >= t_i:
            t_cur, t_i = t_cur - t_i, t_i * 2
        for base, lr in zip(LRS, prod.get_last_lr()):
            cosf = (0.001 + (base - 0.001) * (1 + math.cos(math.pi * t_cur / t_i)) / 2) / base
            assert lr == pytest.approx(base * lin * cosf, rel=1e-12), e
        eo.step()
        prod.step()


def test_product_errors() -> None:
    eo, _ = _pair()
    other, _ = _pair()
    with pytest.raises(ember.ValueRangeError, match="at least one scheduler"):
        ls.ProductLR(eo, [])
    with pytest.raises(ember.ValueRangeError, match=r"schedulers\[1\] \(StepLR\) is bound to a different optimizer"):
        ls.ProductLR(eo, [ls.StepLR(eo, 2), ls.StepLR(other, 2)])
    with pytest.raises(ember.DTypeError, match=r"schedulers\[0\] is int"):
        ls.ProductLR(eo, [3])


def test_product_state_dict_round_trip() -> None:
    eo, _ = _pair()
    prod = ls.ProductLR(eo, [ls.LinearLR(eo, total_iters=4), ls.ExponentialLR(eo, 0.9)])
    for _ in range(7):
        prod.step()
    sd = pickle.loads(pickle.dumps(prod.state_dict()))
    eo2, _ = _pair()
    prod2 = ls.ProductLR(eo2, [ls.LinearLR(eo2, total_iters=4), ls.ExponentialLR(eo2, 0.9)])
    prod2.load_state_dict(sd)
    for _ in range(5):
        prod.step()
        prod2.step()
        assert prod2.get_last_lr() == prod.get_last_lr()
    with pytest.raises(ember.ValueRangeError, match="saved state has 2 schedulers"):
        ls.ProductLR(eo2, [ls.LinearLR(eo2)]).load_state_dict(sd)


@pytest.mark.parametrize("name,kwargs", [c for c in CASES if c[0] != "LambdaLR"] + [("OneCycleLR", ONECYCLE[2])],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_state_dict_resume(name: str, kwargs: dict) -> None:
    eo, _ = _pair()
    s = getattr(ls, name)(eo, **kwargs)
    for _ in range(17):
        eo.step()
        s.step()
    sd = pickle.loads(pickle.dumps({"opt": eo.state_dict(), "sched": s.state_dict()}))
    assert "optimizer" not in sd["sched"] and sd["sched"]["last_epoch"] == 17
    eo2, _ = _pair()
    s2 = getattr(ls, name)(eo2, **kwargs)
    eo2.load_state_dict(sd["opt"])
    s2.load_state_dict(sd["sched"])
    for _ in range(20):
        eo.step()
        s.step()
        eo2.step()
        s2.step()
        assert s2.get_last_lr() == s.get_last_lr()
        assert [g["lr"] for g in eo2.param_groups] == [g["lr"] for g in eo.param_groups]


def test_lambda_state_dict_keeps_callable_object_state() -> None:
    class Fn:
        def __init__(self) -> None:
            self.k = 0.5

        def __call__(self, e: int) -> float:
            return self.k**e

    eo, _ = _pair()
    f = Fn()
    s = ls.LambdaLR(eo, [f, lambda e: 1.0])
    f.k = 0.25
    sd = s.state_dict()
    assert sd["lr_lambdas"] == [{"k": 0.25}, None]
    eo2, _ = _pair()
    g = Fn()
    s2 = ls.LambdaLR(eo2, [g, lambda e: 1.0])
    s2.load_state_dict(sd)
    assert g.k == 0.25


def test_closed_form_step_with_epoch_matches_torch() -> None:
    for name, kw in [("StepLR", {"step_size": 3}), ("ExponentialLR", {"gamma": 0.9}),
                     ("CosineAnnealingLR", {"T_max": 10}), ("MultiStepLR", {"milestones": [2, 5]}),
                     ("CosineAnnealingWarmRestarts", {"T_0": 3, "T_mult": 2})]:
        eo, to = _pair()
        es, ts = getattr(ls, name)(eo, **kw), getattr(tls, name)(to, **kw)
        for e in (4, 9, 2, 13):
            es.step(e)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's deprecation warning for step(epoch)
                ts.step(e)
            np.testing.assert_allclose(es.get_last_lr(), ts.get_last_lr(), rtol=1e-12, err_msg=f"{name} {e}")


def test_warm_restarts_fractional_epochs_match_torch() -> None:
    eo, to = _pair()
    es = ls.CosineAnnealingWarmRestarts(eo, T_0=2, T_mult=2)
    ts = tls.CosineAnnealingWarmRestarts(to, T_0=2, T_mult=2)
    for i in range(40):
        e = i / 4
        es.step(e)
        ts.step(e)
        np.testing.assert_allclose(es.get_last_lr(), ts.get_last_lr(), rtol=1e-12)
    with pytest.raises(ember.ValueRangeError, match="non-negative epoch"):
        es.step(-1)


def test_initial_lr_and_base_lrs() -> None:
    eo, _ = _pair()
    s = ls.ExponentialLR(eo, 0.5)
    assert s.base_lrs == list(LRS) and [g["initial_lr"] for g in eo.param_groups] == list(LRS)
    assert s.last_epoch == 0 and s.get_last_lr() == list(LRS)
    s.step()
    assert s.get_last_lr() == [0.05, 0.01]


def test_resume_without_initial_lr_errors() -> None:
    eo, _ = _pair()
    with pytest.raises(ember.ValueRangeError, match=r"'initial_lr' is not specified in param_groups\[0\]"):
        ls.StepLR(eo, 3, last_epoch=5)


def test_constructor_errors() -> None:
    eo, _ = _pair()
    with pytest.raises(ember.DTypeError, match="StepLR: list is not an Optimizer"):
        ls.StepLR([], 3)
    with pytest.raises(ember.ValueRangeError, match="step_size must be a positive integer"):
        ls.StepLR(eo, 0)
    with pytest.raises(ember.ValueRangeError, match="start_factor"):
        ls.LinearLR(eo, start_factor=0)
    with pytest.raises(ember.ValueRangeError, match="end_factor"):
        ls.LinearLR(eo, end_factor=1.5)
    with pytest.raises(ember.ValueRangeError, match="T_max must be positive"):
        ls.CosineAnnealingLR(eo, T_max=0)
    with pytest.raises(ember.ValueRangeError, match="positive integer T_0"):
        ls.CosineAnnealingWarmRestarts(eo, T_0=0)
    with pytest.raises(ember.ValueRangeError, match="T_mult >= 1"):
        ls.CosineAnnealingWarmRestarts(eo, T_0=2, T_mult=0)
    with pytest.raises(ember.ValueRangeError, match="expected 2 values for lr_lambda"):
        ls.LambdaLR(eo, [lambda e: 1.0])
    with pytest.raises(ember.DTypeError, match="lr_lambda must be callable"):
        ls.LambdaLR(eo, 3)
