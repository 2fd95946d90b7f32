"""PolynomialLR, CyclicLR, SequentialLR, ChainedScheduler and ReduceLROnPlateau against torch.optim.lr_scheduler:
the learning-rate (and cycled momentum) sequences over 30+ steps, state_dict round trips, and the errors."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable

import numpy as np
import pytest

import ember
from ember import nn
from ember.optim import SGD, Adam, Adamax
from ember.optim import lr_scheduler as ls

torch = pytest.importorskip("torch")
tls = torch.optim.lr_scheduler

STEPS = 36
LRS = (0.1, 0.02)


def _pair(opt: str = "SGD") -> tuple[object, object]:
    e = [{"params": [nn.Parameter(ember.zeros(2))], "lr": LRS[0]}, {"params": [nn.Parameter(ember.zeros(2))]}]
    t = [{"params": [torch.zeros(2, requires_grad=True)], "lr": LRS[0]},
         {"params": [torch.zeros(2, requires_grad=True)]}]
    if opt == "SGD":
        return SGD(e, lr=LRS[1], momentum=0.9), torch.optim.SGD(t, lr=LRS[1], momentum=0.9)
    if opt == "Adamax":
        return Adamax(e, lr=LRS[1]), torch.optim.Adamax(t, lr=LRS[1])
    return Adam(e, lr=LRS[1]), torch.optim.Adam(t, lr=LRS[1])


def _row(opt: object, keys: tuple[str, ...]) -> list[float]:
    row = [g["lr"] for g in opt.param_groups]
    for k in keys:
        for g in opt.param_groups:
            row += list(g[k]) if isinstance(g[k], tuple) else [g[k]]
    return row


def _run(opt: object, sched: object, steps: int, keys: tuple[str, ...] = (), metrics: list | None = None) -> list:
    out = []
    for i in range(steps):
        out.append(_row(opt, keys))
        opt.step()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's chained-scheduler / deprecation warnings
            sched.step() if metrics is None else sched.step(metrics[i])
        assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
    return out


def _close(ev: list, tv: list, what: str, rtol: float = 1e-12) -> None:
    for i, (a, b) in enumerate(zip(ev, tv)):
        np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol, atol=1e-15,
                                   err_msg=f"{what} at step {i}")


def _compare(make: Callable[[object, object], object], opt: str = "SGD", keys: tuple[str, ...] = (),
             metrics: list | None = None, steps: int = STEPS, rtol: float = 1e-12) -> None:
    eo, to = _pair(opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        es, ts = make(eo, ls), make(to, tls)
    _close(_run(eo, es, steps, keys, metrics), _run(to, ts, steps, keys, metrics), repr(es), rtol)


# -- PolynomialLR -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"total_iters": 20, "power": 2.0}, {"total_iters": 12, "power": 0.5}],
                         ids=["default", "power2", "sqrt"])
def test_polynomial_matches_torch(kwargs: dict) -> None:
    _compare(lambda o, m: m.PolynomialLR(o, **kwargs), rtol=1e-10)


# -- CyclicLR -----------------------------------------------------------------------------------------------------
CYCLIC = [
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 4},
    {"base_lr": [0.01, 0.002], "max_lr": [0.1, 0.05], "step_size_up": 3, "step_size_down": 5, "mode": "triangular2"},
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 5, "mode": "exp_range", "gamma": 0.95},
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 4, "base_momentum": 0.7, "max_momentum": 0.95},
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 4, "cycle_momentum": False},
]


@pytest.mark.parametrize("kwargs", CYCLIC, ids=["triangular", "triangular2", "exp_range", "momentum", "no_momentum"])
def test_cyclic_matches_torch_lr_and_momentum(kwargs: dict) -> None:
    _compare(lambda o, m: m.CyclicLR(o, **kwargs), keys=("momentum",))


def test_cyclic_cycles_adam_beta1_and_custom_scale_fn() -> None:
    _compare(lambda o, m: m.CyclicLR(o, 0.001, 0.01, step_size_up=3), opt="Adam", keys=("betas",))
    _compare(lambda o, m: m.CyclicLR(o, 0.001, 0.01, step_size_up=3, scale_fn=lambda x: 1 / (1 + x),
                                     scale_mode="iterations"), opt="Adamax", keys=("betas",))


def test_cyclic_errors() -> None:
    eo, _ = _pair()
    with pytest.raises(ember.ValueRangeError, match="mode 'bogus' is invalid"):
        ls.CyclicLR(eo, 0.01, 0.1, mode="bogus")
    with pytest.raises(ember.ValueRangeError, match="base_lr"):
        ls.CyclicLR(eo, [0.01], 0.1)
    with pytest.raises(ember.ValueRangeError, match="step_size_up"):
        ls.CyclicLR(eo, 0.01, 0.1, step_size_up=0)
    from ember.optim import Adagrad
    with pytest.raises(ember.ValueRangeError, match="momentum or beta1"):
        ls.CyclicLR(Adagrad([nn.Parameter(ember.zeros(2))]), 0.01, 0.1)


# -- SequentialLR / ChainedScheduler ------------------------------------------------------------------------------
def test_sequential_matches_torch() -> None:
    _compare(lambda o, m: m.SequentialLR(o, [m.LinearLR(o, start_factor=0.1, total_iters=5),
                                             m.CosineAnnealingLR(o, T_max=20)], milestones=[5]), rtol=1e-10)
    _compare(lambda o, m: m.SequentialLR(o, [m.MultiStepLR(o, [2], gamma=0.5), m.ExponentialLR(o, gamma=0.9),
                                             m.StepLR(o, step_size=4, gamma=0.5)],
                                         milestones=[4, 15]), rtol=1e-10)


def test_chained_matches_torch() -> None:
    _compare(lambda o, m: m.ChainedScheduler([m.LinearLR(o, start_factor=0.2, total_iters=6),
                                              m.ExponentialLR(o, gamma=0.93), m.MultiStepLR(o, [10, 20], 0.5)]),
             rtol=1e-10)
    _compare(lambda o, m: m.ChainedScheduler([m.PolynomialLR(o, total_iters=25, power=1.5),
                                              m.StepLR(o, 7, 0.3)], optimizer=o), rtol=1e-10)


def test_sequential_of_chained_and_state_dict_round_trip() -> None:
    def make(o: object) -> ls.SequentialLR:
        warm = ls.LinearLR(o, start_factor=0.1, total_iters=4)
        chain = ls.ChainedScheduler([ls.ExponentialLR(o, 0.9), ls.StepLR(o, 5, 0.5)])
        return ls.SequentialLR(o, [warm, chain], milestones=[4])

    eo, _ = _pair()
    s = make(eo)
    for _ in range(9):
        eo.step()
        s.step()
    # after the milestone the chain runs from its own epoch 0: lr = base * 0.9**5 * 0.5 at epoch 9
    assert s.get_last_lr() == pytest.approx([b * 0.9**5 * 0.5 for b in LRS])
    sd = pickle.loads(pickle.dumps(s.state_dict()))
    eo2, _ = _pair()
    s2 = make(eo2)
    s2.load_state_dict(sd)
    for _ in range(12):
        s.step()
        s2.step()
        assert s2.get_last_lr() == s.get_last_lr()
    with pytest.raises(ember.ValueRangeError, match="saved state has 2 schedulers"):
        ls.SequentialLR(eo2, [ls.StepLR(eo2, 2)], []).load_state_dict(sd)


def test_sequential_and_chained_errors() -> None:
    eo, _ = _pair()
    other, _ = _pair()
    with pytest.raises(ember.ValueRangeError, match="one more scheduler than milestones"):
        ls.SequentialLR(eo, [ls.StepLR(eo, 2), ls.StepLR(eo, 3)], milestones=[])
    with pytest.raises(ember.ValueRangeError, match="same optimizer"):
        ls.SequentialLR(eo, [ls.StepLR(eo, 2), ls.StepLR(other, 3)], milestones=[3])
    with pytest.raises(ember.ValueRangeError, match="at least one scheduler"):
        ls.SequentialLR(eo, [], milestones=[])
    with pytest.raises(ember.ValueRangeError, match="ReduceLROnPlateau"):
        ls.SequentialLR(eo, [ls.ReduceLROnPlateau(eo)], milestones=[])
    with pytest.raises(ember.ValueRangeError, match="ChainedScheduler: .*ReduceLROnPlateau"):
        ls.ChainedScheduler([ls.StepLR(eo, 2), ls.ReduceLROnPlateau(eo)])
    with pytest.raises(ember.ValueRangeError, match="at least one scheduler"):
        ls.ChainedScheduler([])
    with pytest.raises(ember.ValueRangeError, match=r"ChainedScheduler: schedulers\[1\] .*different optimizer"):
        ls.ChainedScheduler([ls.StepLR(eo, 2), ls.StepLR(other, 2)])


# -- ReduceLROnPlateau --------------------------------------------------------------------------------------------
METRICS = [1.0, 0.9, 0.95, 0.95, 0.9, 0.91, 0.92, 0.93, 0.85, 0.86, 0.86, 0.86, 0.86, 0.86, 0.7, 0.7, 0.7, 0.7,
           0.7, 0.7, 0.69999, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
PLATEAU = [
    {"patience": 2},
    {"mode": "max", "patience": 1, "factor": 0.5},
    {"patience": 1, "threshold": 0.05, "threshold_mode": "abs", "cooldown": 2},
    {"mode": "max", "patience": 0, "threshold_mode": "abs", "threshold": 0.01, "factor": 0.3},
    {"patience": 0, "factor": 0.5, "min_lr": 0.004},
    {"patience": 0, "factor": 0.5, "min_lr": [0.05, 0.001], "cooldown": 1},
    {"patience": 0, "factor": 0.99, "eps": 1e-3},  # reductions below eps are skipped
]


@pytest.mark.parametrize("kwargs", PLATEAU, ids=[f"p{i}" for i in range(len(PLATEAU))])
def test_plateau_matches_torch(kwargs: dict) -> None:
    _compare(lambda o, m: m.ReduceLROnPlateau(o, **kwargs), metrics=METRICS)
    _compare(lambda o, m: m.ReduceLROnPlateau(o, **kwargs), metrics=[-x for x in METRICS])


def test_plateau_accepts_tensor_metric_and_round_trips() -> None:
    eo, to = _pair()
    s, t = ls.ReduceLROnPlateau(eo, patience=1, cooldown=1), tls.ReduceLROnPlateau(to, patience=1, cooldown=1)
    for m in METRICS[:10]:
        s.step(ember.tensor(m))
        t.step(torch.tensor(m))
    assert s.get_last_lr() == t.get_last_lr()
    sd = pickle.loads(pickle.dumps(s.state_dict()))
    assert set(sd) == set(t.state_dict())
    eo2, _ = _pair()
    s2 = ls.ReduceLROnPlateau(eo2, patience=5)
    eo2.load_state_dict(eo.state_dict())
    s2.load_state_dict(sd)
    assert s2.patience == 1 and s2.best == s.best
    for m in METRICS[10:]:
        s.step(m)
        s2.step(m)
        assert s2.get_last_lr() == s.get_last_lr()
    # a fresh state (best = inf) also round trips
    s3 = ls.ReduceLROnPlateau(_pair()[0])
    s3.load_state_dict(pickle.loads(pickle.dumps(ls.ReduceLROnPlateau(_pair()[0], mode="max").state_dict())))
    assert s3.mode == "max" and s3.best == -float("inf")
    with pytest.raises(ember.ValueRangeError, match="num_bad_epochs"):
        s3.load_state_dict({**sd, "num_bad_epochs": -1})
    with pytest.raises(ember.ValueRangeError, match="missing"):
        s3.load_state_dict({k: v for k, v in sd.items() if k != "best"})


def test_plateau_errors() -> None:
    eo, _ = _pair()
    with pytest.raises(ember.ValueRangeError, match="factor should be < 1.0"):
        ls.ReduceLROnPlateau(eo, factor=1.0)
    with pytest.raises(ember.ValueRangeError, match="mode 'up' is unknown"):
        ls.ReduceLROnPlateau(eo, mode="up")
    with pytest.raises(ember.ValueRangeError, match="threshold mode 'x' is unknown"):
        ls.ReduceLROnPlateau(eo, threshold_mode="x")
    with pytest.raises(ember.ValueRangeError, match="expected 2 min_lrs"):
        ls.ReduceLROnPlateau(eo, min_lr=[0.1])
    with pytest.raises(ember.DTypeError, match="metrics must be a number"):
        ls.ReduceLROnPlateau(eo).step("bad")
    for cls, kw in ((tls.ReduceLROnPlateau, {"factor": 1.0}), (tls.ReduceLROnPlateau, {"mode": "up"})):
        with pytest.raises(ValueError):  # torch rejects the same
            cls(_pair()[1], **kw)


# -- state dicts of the closed-form ones ----------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda o: ls.PolynomialLR(o, total_iters=20, power=2.0),
                                  lambda o: ls.CyclicLR(o, 0.01, 0.1, step_size_up=4, mode="triangular2"),
                                  lambda o: ls.CyclicLR(o, 0.01, 0.1, step_size_up=3, mode="exp_range",
                                                        gamma=0.9)],
                         ids=["polynomial", "cyclic_triangular2", "cyclic_exp_range"])
def test_state_dict_resume(make: Callable[[object], object]) -> None:
    eo, _ = _pair()
    s = make(eo)
    for _ in range(13):
        eo.step()
        s.step()
    sd = pickle.loads(pickle.dumps({"opt": eo.state_dict(), "sched": s.state_dict()}))
    eo2, _ = _pair()
    s2 = make(eo2)
    eo2.load_state_dict(sd["opt"])
    s2.load_state_dict(sd["sched"])
    for _ in range(20):
        for o, x in ((eo, s), (eo2, s2)):
            o.step()
            x.step()
        assert s2.get_last_lr() == s.get_last_lr()
        assert _row(eo2, ("momentum",)) == _row(eo, ("momentum",))


def test_exported() -> None:
    for name in ("PolynomialLR", "ChainedScheduler", "SequentialLR", "ReduceLROnPlateau", "CyclicLR"):
        assert name in ls.__all__ and getattr(ls, name).__name__ == name
