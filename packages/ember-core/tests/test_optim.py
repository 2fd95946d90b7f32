"""ember.optim against torch.optim: identical initial parameters and gradient sequences, float64, tight tolerance."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import ember
from ember import nn
from ember.optim import SGD, Adagrad, Adam, AdamW, Lion, Optimizer, RMSprop

torch = pytest.importorskip("torch")

SHAPES = [(3, 4), (5,), ()]
STEPS = 12
RTOL, ATOL = 1e-11, 1e-13
AD = ember.Device.flex().autodiff()


def _data(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s) for s in SHAPES]
    grads = [[rng.standard_normal(s) * (1 + step % 3) for s in SHAPES] for step in range(STEPS)]
    return init, grads


def _ember_params(init: list[np.ndarray], device: ember.Device | None = None) -> list[nn.Parameter]:
    return [nn.Parameter(ember.tensor(a.copy(), dtype=ember.float64, device=device)) for a in init]


def _run_pair(ember_cls: type, torch_cls: type, kwargs: dict, device: ember.Device | None = None,
              steps: int = STEPS, group_kwargs: list[dict] | None = None) -> tuple[list, list, Optimizer, object]:
    init, grads = _data()
    ep = _ember_params(init, device)
    tp = [torch.tensor(a.copy(), requires_grad=True) for a in init]

    def groups(ps: list) -> list:
        if group_kwargs is None:
            return ps
        return [{"params": ps[:1], **group_kwargs[0]}, {"params": ps[1:], **group_kwargs[1]}]

    eo = ember_cls(groups(ep), **kwargs)
    to = torch_cls(groups(tp), **kwargs)
    for step in range(steps):
        for p, g in zip(ep, grads[step]):
            p.grad = ember.tensor(g, dtype=ember.float64, device=device)
        for p, g in zip(tp, grads[step]):
            p.grad = torch.tensor(g)
        eo.step()
        to.step()
        for a, b in zip(ep, tp):
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"{ember_cls.__name__}{kwargs} step {step}")
    return ep, tp, eo, to


CASES = [
    (SGD, {"lr": 0.1}),
    (SGD, {"lr": 0.05, "momentum": 0.9}),
    (SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.01}),
    (SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.1}),
    (SGD, {"lr": 0.05, "momentum": 0.5, "maximize": True}),
    (Adam, {}),
    (Adam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05}),
    (Adam, {"lr": 0.01, "amsgrad": True}),
    (Adam, {"lr": 0.01, "maximize": True, "weight_decay": 0.1}),
    (Adam, {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    (Adam, {"lr": 0.01, "betas": (0.3, 0.4)}),  # beta1 < 0.5: lerp takes its other branch
    (AdamW, {}),
    (AdamW, {"lr": 0.02, "weight_decay": 0.3, "amsgrad": True}),
    (AdamW, {"lr": 0.02, "weight_decay": 0.0}),
    (RMSprop, {}),
    (RMSprop, {"lr": 0.01, "alpha": 0.9, "weight_decay": 0.1}),
    (RMSprop, {"lr": 0.01, "momentum": 0.9}),
    (RMSprop, {"lr": 0.01, "centered": True}),
    (RMSprop, {"lr": 0.01, "centered": True, "momentum": 0.5, "maximize": True, "alpha": 0.3}),
    (Adagrad, {}),
    (Adagrad, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1}),
    (Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-5, "maximize": True}),
]


def _id(case: tuple) -> str:
    return f"{case[0].__name__}-" + "-".join(f"{k}={v}" for k, v in case[1].items())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_matches_torch(case: tuple) -> None:
    cls, kwargs = case
    _, _, eo, to = _run_pair(cls, getattr(torch.optim, cls.__name__), kwargs)
    # the state buffers match too (same names, same values)
    for ps, ts in zip(eo.state.values(), to.state.values()):
        assert set(ps) == set(ts)
        for k in ps:
            np.testing.assert_allclose(np.asarray(ps[k].numpy()), ts[k].detach().numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", [CASES[2], CASES[7], CASES[12], CASES[18], CASES[21]],
                         ids=lambda c: _id(c))
def test_matches_torch_on_autodiff_device(case: tuple) -> None:
    cls, kwargs = case
    ep, _, _, _ = _run_pair(cls, getattr(torch.optim, cls.__name__), kwargs, device=AD)
    for p in ep:  # the updates kept the parameters leaves that require grad
        assert p.is_leaf and p.requires_grad and p.device is AD


def test_param_groups_with_own_options_match_torch() -> None:
    _run_pair(Adam, torch.optim.Adam, {"lr": 0.01},
              group_kwargs=[{"lr": 0.1, "betas": (0.5, 0.9)}, {"weight_decay": 0.2, "amsgrad": True}])
    _run_pair(SGD, torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}, group_kwargs=[{"lr": 0.1}, {"nesterov": True}])


def test_group_keys_and_defaults_match_torch() -> None:
    p = [torch.zeros(2, requires_grad=True)]
    q = [nn.Parameter(ember.zeros(2))]
    for cls in (SGD, Adam, AdamW, RMSprop, Adagrad):
        tg = getattr(torch.optim, cls.__name__)(p).param_groups[0]
        eg = cls(q).param_groups[0]
        assert set(eg) == set(tg), cls.__name__
        for k in tg:
            if k != "params":
                assert eg[k] == tg[k], (cls.__name__, k)


def test_float32_smoke() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 3)).astype(np.float32)
    p = nn.Parameter(ember.tensor(a))
    t = torch.tensor(a, requires_grad=True)
    eo, to = AdamW([p], lr=0.01), torch.optim.AdamW([t], lr=0.01)
    for _ in range(5):
        g = rng.standard_normal((4, 3)).astype(np.float32)
        p.grad, t.grad = ember.tensor(g), torch.tensor(g)
        eo.step()
        to.step()
    assert p.dtype is ember.float32 and eo.state[p]["exp_avg"].dtype is ember.float32
    np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_end_to_end_backward_matches_torch() -> None:
    """A tiny regression trained with real backward on the differentiable device follows torch."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 3)), rng.standard_normal((8, 2))
    w0, b0 = rng.standard_normal((3, 2)), rng.standard_normal(2)
    ew = nn.Parameter(ember.tensor(w0, device=AD))
    eb = nn.Parameter(ember.tensor(b0, device=AD))
    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    ex, ey = ember.tensor(x, device=AD), ember.tensor(y, device=AD)
    tx, ty = torch.tensor(x), torch.tensor(y)
    eo = Adam([ew, eb], lr=0.05, weight_decay=0.01)
    to = torch.optim.Adam([tw, tb], lr=0.05, weight_decay=0.01)
    losses = []
    for _ in range(10):
        eo.zero_grad()
        to.zero_grad()

        def eclosure() -> ember.Tensor:
            loss = ((ex @ ew + eb - ey) ** 2).mean()
            loss.backward()
            return loss

        el = eo.step(eclosure)
        tl = ((tx @ tw + tb - ty) ** 2).mean()
        tl.backward()
        to.step()
        losses.append(el.item())
        np.testing.assert_allclose(el.item(), tl.item(), rtol=1e-10)
        np.testing.assert_allclose(ew.numpy(), tw.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(eb.numpy(), tb.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert losses[-1] < losses[0]


# -- Lion: no torch reference; numpy implementation of the paper's update ------------------------------------------
def _lion_numpy(init: list[np.ndarray], grads: list[list[np.ndarray]], lr: float, betas: tuple[float, float],
                wd: float, maximize: bool = False) -> list[list[np.ndarray]]:
    b1, b2 = betas
    ps = [a.copy() for a in init]
    ms = [np.zeros_like(a) for a in init]
    history = []
    for gs in grads:
        for i, g in enumerate(gs):
            g = -g if maximize else g
            c = b1 * ms[i] + (1 - b1) * g
            ps[i] = ps[i] - lr * (np.sign(c) + wd * ps[i])
            ms[i] = b2 * ms[i] + (1 - b2) * g
        history.append([p.copy() for p in ps])
    return history


@pytest.mark.parametrize("kwargs", [{}, {"lr": 1e-2, "betas": (0.95, 0.98), "weight_decay": 0.5},
                                    {"lr": 3e-3, "maximize": True, "weight_decay": 0.1}])
@pytest.mark.parametrize("device", [None, AD], ids=["flex", "autodiff"])
def test_lion_matches_paper(kwargs: dict, device: ember.Device | None) -> None:
    init, grads = _data(7)
    ep = _ember_params(init, device)
    opt = Lion(ep, **kwargs)
    d = {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0, "maximize": False} | kwargs
    ref = _lion_numpy(init, grads, d["lr"], d["betas"], d["weight_decay"], d["maximize"])
    for step, gs in enumerate(grads):
        for p, g in zip(ep, gs):
            p.grad = ember.tensor(g, device=device)
        opt.step()
        for p, r in zip(ep, ref[step]):
            np.testing.assert_allclose(p.numpy(), r, rtol=1e-12, atol=1e-14)


def test_lion_defaults() -> None:
    opt = Lion([nn.Parameter(ember.zeros(2))])
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (1e-4, (0.9, 0.99), 0.0)


# -- state_dict / resume -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [CASES[3], CASES[7], CASES[12], CASES[18], CASES[21]], ids=lambda c: _id(c))
def test_state_dict_resume_continues_identically(case: tuple) -> None:
    cls, kwargs = case
    init, grads = _data(5)
    full = _ember_params(init)
    opt = cls(full, **kwargs)
    half = _ember_params(init)
    opt_a = cls(half, **kwargs)
    for step in range(STEPS):
        for p, q, g in zip(full, half, grads[step]):
            p.grad = ember.tensor(g)
            q.grad = ember.tensor(g)
        opt.step()
        opt_a.step()
        if step == STEPS // 2 - 1:
            # checkpoint through pickle (as a user would save it), resume in a fresh optimizer over copies
            blob = pickle.dumps({"params": [q.numpy().copy() for q in half], "opt": opt_a.state_dict()})
            saved = pickle.loads(blob)
            half = _ember_params(saved["params"])
            opt_a = cls(half, lr=123.0)  # hyper-parameters come back from the checkpoint
            opt_a.load_state_dict(saved["opt"])
    for p, q in zip(full, half):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_state_dict_format_matches_torch() -> None:
    init, grads = _data()
    _, _, eo, to = _run_pair(Adam, torch.optim.Adam, {"lr": 0.01}, steps=2,
                             group_kwargs=[{"lr": 0.1}, {"amsgrad": True}])
    es, ts = eo.state_dict(), to.state_dict()
    assert list(es) == list(ts) == ["state", "param_groups"]
    assert sorted(es["state"]) == sorted(ts["state"]) == [0, 1, 2]
    assert [g["params"] for g in es["param_groups"]] == [g["params"] for g in ts["param_groups"]] == [[0], [1, 2]]
    for eg, tg in zip(es["param_groups"], ts["param_groups"]):
        assert eg == tg
    for i in range(3):
        assert set(es["state"][i]) == set(ts["state"][i])
        assert es["state"][i]["step"].dtype is ember.float32
        assert es["state"][i]["step"].item() == ts["state"][i]["step"].item() == 2


def test_load_state_dict_casts_to_param_dtype_and_copies() -> None:
    p = nn.Parameter(ember.zeros(3, dtype=ember.float64))
    p.grad = ember.ones(3, dtype=ember.float64)
    opt = Adam([p])
    opt.step()
    sd = opt.state_dict()
    q = nn.Parameter(ember.zeros(3, dtype=ember.float32))
    opt2 = Adam([q])
    opt2.load_state_dict(sd)
    assert opt2.state[q]["exp_avg"].dtype is ember.float32
    assert opt2.state[q]["step"].dtype is ember.float32
    opt2.state[q]["exp_avg"].fill_(5.0)  # a copy: the source optimizer's buffer is untouched
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.1] * 3)


def test_load_state_dict_mismatch_errors() -> None:
    a, b = nn.Parameter(ember.zeros(2)), nn.Parameter(ember.zeros(2))
    sd = SGD([a, b]).state_dict()
    with pytest.raises(ember.ValueRangeError, match="parameter groups"):
        SGD([{"params": [a]}, {"params": [b]}]).load_state_dict(sd)
    with pytest.raises(ember.ValueRangeError, match="group 0 has 2 parameters.*has 1"):
        SGD([a]).load_state_dict(sd)
    with pytest.raises(ember.ValueRangeError, match="'state' and 'param_groups'"):
        SGD([a]).load_state_dict({"foo": 1})


# -- base-class behaviour ----------------------------------------------------------------------------------------
def test_zero_grad() -> None:
    ps = _ember_params(_data()[0], AD)
    opt = SGD(ps, lr=0.1)
    for p in ps:
        p.grad = ember.ones(p.shape, dtype=ember.float64, device=AD)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in ps)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)


def test_step_skips_params_without_grad_and_returns_closure_loss() -> None:
    a, b = nn.Parameter(ember.ones(2)), nn.Parameter(ember.ones(2))
    opt = Adam([a, b], lr=0.5)
    a.grad = ember.ones(2)
    assert opt.step(lambda: 42) == 42
    assert b.tolist() == [1.0, 1.0] and b not in opt.state
    assert a.tolist() == pytest.approx([0.5, 0.5])


def test_closure_runs_with_grad_enabled() -> None:
    seen = []
    opt = SGD([nn.Parameter(ember.zeros(1))])
    with ember.no_grad():
        opt.step(lambda: seen.append(ember.is_grad_enabled()))
    assert seen == [True]


def test_add_param_group_and_named_params() -> None:
    a, b = nn.Parameter(ember.zeros(2)), nn.Parameter(ember.zeros(2))
    opt = SGD([a], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": b, "lr": 0.01})
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    assert opt.param_groups[1]["momentum"] == 0.9 and opt.param_groups[1]["params"] == [b]
    named = SGD([("w", a), ("v", b)])
    assert named.param_groups[0]["param_names"] == ["w", "v"]
    assert named.state_dict()["param_groups"][0]["param_names"] == ["w", "v"]


def test_repr_lists_groups() -> None:
    r = repr(Adam([nn.Parameter(ember.zeros(1))], lr=0.5))
    assert r.startswith("Adam (") and "Parameter Group 0" in r and "lr: 0.5" in r


# -- errors --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [SGD, Adam, AdamW, RMSprop, Adagrad, Lion])
def test_empty_parameter_list(cls: type) -> None:
    with pytest.raises(ember.ValueRangeError, match="optimizer got an empty parameter list"):
        cls([])
    with pytest.raises(ember.ValueRangeError, match="empty parameter list"):
        cls(iter(()))


def test_non_leaf_tensor_rejected() -> None:
    p = nn.Parameter(ember.ones(2, device=AD))
    with pytest.raises(ember.AutodiffError, match="can't optimize a non-leaf Tensor"):
        SGD([p * 2])


def test_bad_param_types() -> None:
    p = nn.Parameter(ember.ones(2))
    with pytest.raises(ember.DTypeError, match="iterable of Tensors or dicts.*got a Tensor"):
        SGD(p)
    with pytest.raises(ember.DTypeError, match="can only optimize Tensors.*int"):
        SGD([p, 3])
    with pytest.raises(ember.DTypeError, match="ordered collections"):
        SGD([{"params": {p}}])
    with pytest.raises(ember.DTypeError, match="must be a dict"):
        SGD([p]).add_param_group([p])
    with pytest.raises(ember.DTypeError, match="iterable"):
        SGD(5)


def test_param_in_two_groups_rejected() -> None:
    a, b = nn.Parameter(ember.ones(2)), nn.Parameter(ember.ones(2))
    with pytest.raises(ember.ValueRangeError, match="more than one parameter group"):
        SGD([{"params": [a, b]}, {"params": [b]}])
    opt = SGD([a])
    with pytest.raises(ember.ValueRangeError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(ember.ValueRangeError, match="same parameter more than once"):
        SGD([a, a])


@pytest.mark.parametrize("cls,kwargs,match", [
    (SGD, {"lr": -0.1}, r"SGD: invalid learning rate \(lr\) -0.1"),
    (SGD, {"momentum": -1}, "SGD: invalid momentum value -1"),
    (SGD, {"weight_decay": -1}, "weight_decay"),
    (SGD, {"nesterov": True}, "Nesterov momentum requires a momentum and zero dampening"),
    (SGD, {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "zero dampening"),
    (Adam, {"lr": -1e-3}, r"Adam: invalid learning rate \(lr\)"),
    (Adam, {"betas": (1.0, 0.9)}, r"Adam: invalid beta parameter at index 0 \(betas\[0\]\) 1.0.*\[0.0, 1.0\)"),
    (Adam, {"betas": (0.9, -0.1)}, r"betas\[1\]"),
    (Adam, {"betas": (0.9,)}, "betas must be a pair"),
    (Adam, {"eps": -1.0}, "eps"),
    (AdamW, {"weight_decay": -0.1}, "AdamW: invalid weight_decay"),
    (RMSprop, {"alpha": -0.5}, "RMSprop: invalid alpha"),
    (RMSprop, {"lr": "x"}, "expected a number"),
    (Adagrad, {"lr_decay": -1}, "Adagrad: invalid lr_decay"),
    (Adagrad, {"initial_accumulator_value": -1}, "initial_accumulator_value"),
    (Lion, {"betas": (0.9, 1.5)}, r"Lion: invalid beta parameter at index 1"),
    (Lion, {"lr": -1}, "Lion: invalid learning rate"),
])
def test_bad_hyper_parameters(cls: type, kwargs: dict, match: str) -> None:
    with pytest.raises(ember.ValueRangeError, match=match):
        cls([nn.Parameter(ember.ones(2))], **kwargs)


def test_bad_hyper_parameter_in_added_group() -> None:
    opt = Adam([nn.Parameter(ember.ones(2))])
    with pytest.raises(ember.ValueRangeError, match="betas"):
        opt.add_param_group({"params": [nn.Parameter(ember.ones(2))], "betas": (0.9, 1.0)})
    assert len(opt.param_groups) == 1


def test_lazy_import() -> None:
    assert ember.optim.SGD is SGD
    assert ember.optim.param_groups is ember.nn.param_group.param_groups
