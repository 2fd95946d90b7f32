"""ParamGroup (select parameters by path, regex or predicate; freeze/unfreeze) and ember.optim.param_groups."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import nn
from ember.nn.param_group import ParamGroup, param_groups
from ember.optim import SGD, AdamW

torch = pytest.importorskip("torch")


class Block(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ember.ones(n, n))
        self.bias = nn.Parameter(ember.zeros(n))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(Block(3), Block(3))
        self.norm = Block(3)
        self.head = Block(2)


def _names(pg: ParamGroup) -> list[str]:
    return [n for n, _ in pg.named_parameters()]


ALL = ["encoder.0.weight", "encoder.0.bias", "encoder.1.weight", "encoder.1.bias", "norm.weight", "norm.bias",
       "head.weight", "head.bias"]


def test_selectors() -> None:
    m = Net()
    assert _names(ParamGroup(m)) == ALL
    assert _names(ParamGroup(m, regex=r"^encoder\.")) == ALL[:4]
    assert _names(ParamGroup(m, regex="bias")) == [n for n in ALL if n.endswith("bias")]
    assert _names(ParamGroup(m, paths=["head.bias", "encoder.0.weight"])) == ["encoder.0.weight", "head.bias"]
    assert _names(ParamGroup(m, paths="norm.weight")) == ["norm.weight"]
    assert _names(ParamGroup(m, where=lambda path, p: p.ndim == 2)) == [n for n in ALL if n.endswith("weight")]
    # several selectors must all match
    assert _names(ParamGroup(m, regex="^encoder", where=lambda path, p: p.ndim == 1)) == ALL[1:4:2]


def test_parameters_are_the_models_objects() -> None:
    m = Net()
    pg = ParamGroup(m, regex="^head")
    assert list(pg) == [m.head.weight, m.head.bias]
    assert list(pg.parameters())[0] is m.head.weight
    assert len(pg) == 2 and pg.num_params() == 6
    assert m.head.bias in pg and m.norm.bias not in pg
    assert "regex='^head'" in repr(pg) and "2 parameters" in repr(pg)


def test_selection_follows_model_changes() -> None:
    m = Net()
    pg = ParamGroup(m, regex="^head")
    m.head.extra = nn.Parameter(ember.zeros(1))
    assert _names(pg) == ["head.weight", "head.bias", "head.extra"]


def test_freeze_unfreeze() -> None:
    dev = ember.Device.flex().autodiff()
    m = Net().to(dev)
    enc = ParamGroup(m, regex=r"^encoder\.")
    assert enc.freeze() is enc
    assert [p.requires_grad for p in m.parameters()] == [False] * 4 + [True] * 4
    enc.unfreeze()
    assert all(p.requires_grad for p in m.parameters())
    # a frozen parameter gets no gradient, so the optimizer leaves it alone
    enc.freeze()
    x = ember.ones(3, device=dev)
    loss = (m.encoder[0].weight @ x).sum() + (m.norm.weight @ x).sum()
    loss.backward()
    assert m.encoder[0].weight.grad is None and m.norm.weight.grad is not None
    before = m.encoder[0].weight.numpy().copy()
    SGD(m.parameters(), lr=0.1).step()
    np.testing.assert_array_equal(m.encoder[0].weight.numpy(), before)
    assert (m.norm.weight.numpy() != 1).all()


def test_errors() -> None:
    m = Net()
    with pytest.raises(ember.ValueRangeError, match=r"Net has no parameter 'head.wieght'.*did you mean 'head.weight'"):
        ParamGroup(m, paths=["head.wieght"])
    with pytest.raises(ember.ValueRangeError, match=r"invalid regex '\('"):
        ParamGroup(m, regex="(")
    with pytest.raises(ember.DTypeError, match="model must be an nn.Module, got list"):
        ParamGroup([], regex="x")
    with pytest.raises(ember.DTypeError, match="where must be a callable"):
        ParamGroup(m, where=3)
    with pytest.raises(ember.DTypeError, match="paths must be strings"):
        ParamGroup(m, paths=[1])
    pg = ParamGroup(m, paths=["head.bias"])
    del m.head.bias
    with pytest.raises(ember.ValueRangeError, match="no parameter 'head.bias'"):
        list(pg.parameters())


def test_param_groups_last_match_wins() -> None:
    m = Net()
    groups = param_groups(m, [
        (ParamGroup(m, regex="bias"), {"weight_decay": 0.0}),
        (ParamGroup(m, regex="^norm"), {"weight_decay": 0.0, "lr": 1e-4}),
        (ParamGroup(m, regex="^nothing"), {"lr": 1.0}),
    ], default={"weight_decay": 0.1})
    assert [g["param_names"] for g in groups] == [
        ["encoder.0.weight", "encoder.1.weight", "head.weight"],
        ["encoder.0.bias", "encoder.1.bias", "head.bias"],
        ["norm.weight", "norm.bias"],  # norm.bias matched both: the later group won
        [],
    ]
    assert [g.get("weight_decay") for g in groups] == [0.1, 0.0, 0.0, None]
    assert groups[2]["lr"] == 1e-4
    every = [p for g in groups for p in g["params"]]
    assert len(every) == len({id(p) for p in every}) == len(list(m.parameters()))
    opt = AdamW(groups, lr=1e-3)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0, 0.0, 0.01]
    assert opt.param_groups[1]["param_names"] == groups[1]["param_names"]


def test_param_groups_trains_like_torch_groups() -> None:
    """The same grouping built by hand in torch gives the same AdamW trajectory."""
    m = Net()
    rng = np.random.default_rng(0)
    for p in m.parameters():
        p.copy_(ember.tensor(rng.standard_normal(p.shape)))
    m.double()
    groups = param_groups(m, [(ParamGroup(m, where=lambda n, p: p.ndim == 1), {"weight_decay": 0.0})],
                          default={"weight_decay": 0.2})
    tparams = {n: torch.tensor(p.numpy().copy(), requires_grad=True) for n, p in m.named_parameters()}
    tgroups = [{"params": [tparams[n] for n in g["param_names"]], "weight_decay": g["weight_decay"]} for g in groups]
    eo, to = AdamW(groups, lr=0.01), torch.optim.AdamW(tgroups, lr=0.01)
    for _ in range(5):
        for n, p in m.named_parameters():
            g = rng.standard_normal(p.shape)
            p.grad = ember.tensor(g)
            tparams[n].grad = torch.tensor(g)
        eo.step()
        to.step()
    for n, p in m.named_parameters():
        np.testing.assert_allclose(p.numpy(), tparams[n].detach().numpy(), rtol=1e-12, atol=1e-14)


def test_param_groups_skip_frozen() -> None:
    m = Net()
    ParamGroup(m, regex="^encoder").freeze()
    groups = param_groups(m, [(ParamGroup(m, regex="bias"), {"weight_decay": 0.0})], skip_frozen=True)
    assert [g["param_names"] for g in groups] == [["norm.weight", "head.weight"], ["norm.bias", "head.bias"]]


def test_param_groups_errors() -> None:
    m, other = Net(), Net()
    with pytest.raises(ember.ValueRangeError, match=r"groups\[0\]'s ParamGroup selects from a different model"):
        param_groups(m, [(ParamGroup(other), {})])
    with pytest.raises(ember.DTypeError, match=r"groups\[0\] must be a \(ParamGroup, dict of options\) pair"):
        param_groups(m, [ParamGroup(m)])
    with pytest.raises(ember.ValueRangeError, match="must not contain 'params'"):
        param_groups(m, [(ParamGroup(m), {"params": []})])
    with pytest.raises(ember.DTypeError, match="model must be an nn.Module"):
        param_groups(3, [])
    with pytest.raises(ember.DTypeError, match="default must be a dict"):
        param_groups(m, [], default=[])


def test_exported_from_optim() -> None:
    assert ember.optim.param_groups is param_groups
