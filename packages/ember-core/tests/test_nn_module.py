"""nn.Module, nn.Parameter and the containers: registration, paths, state, devices, errors."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import ember
from ember import Device, nn

AD = Device.flex().autodiff()


class Affine(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ember.randn(n_out, n_in, dtype=ember.float64))
        self.bias = nn.Parameter(ember.zeros(n_out, dtype=ember.float64))
        self.register_buffer("calls", ember.zeros(1, dtype=ember.int64))
        self.register_buffer("scratch", ember.zeros(2), persistent=False)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        return x @ self.weight.T + self.bias


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(Affine(3, 4), Affine(4, 4))
        self.heads = nn.ModuleDict({"a": Affine(4, 2), "b": Affine(4, 1)})
        self.extra = nn.ModuleList([Affine(2, 2)])
        self.tied = self.enc[0]  # the same module twice: its parameters are listed once

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        return self.heads["a"](self.enc(x))


def test_named_parameters_follow_registration_order_with_stable_dotted_paths() -> None:
    names = [n for n, _ in Net().named_parameters()]
    assert names == [
        "enc.0.weight", "enc.0.bias", "enc.1.weight", "enc.1.bias", "heads.a.weight", "heads.a.bias",
        "heads.b.weight", "heads.b.bias", "extra.0.weight", "extra.0.bias",
    ]


def test_modules_buffers_and_num_params() -> None:
    net = Net()
    assert [n for n, _ in net.named_modules()][:4] == ["", "enc", "enc.0", "enc.1"]
    assert [n for n, _ in net.named_buffers()][:2] == ["enc.0.calls", "enc.0.scratch"]
    assert net.num_params() == (4 * 3 + 4) + (4 * 4 + 4) + (2 * 4 + 2) + (1 * 4 + 1) + (2 * 2 + 2)
    assert [type(c).__name__ for c in net.children()] == ["Sequential", "ModuleDict", "ModuleList", "Affine"]
    assert net.get_parameter("heads.b.bias").shape == (1,)
    with pytest.raises(ember.EmberError, match="no submodule 'nope'"):
        net.get_submodule("enc.nope")


def test_state_dict_holds_parameters_and_persistent_buffers_only() -> None:
    sd = Affine(2, 3).state_dict()
    assert list(sd) == ["weight", "bias", "calls"]
    assert not sd["weight"].requires_grad or sd["weight"].is_leaf


def test_load_state_dict_copies_values_and_reports_keys() -> None:
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())
    partial = {k: v for k, v in a.state_dict().items() if not k.startswith("heads")}
    partial["unknown.weight"] = ember.zeros(1)
    with pytest.raises(ember.EmberError, match="missing keys .*heads.a.weight.*unexpected keys .*unknown.weight"):
        b.load_state_dict(partial)
    missing, unexpected = b.load_state_dict(partial, strict=False)
    assert "heads.a.weight" in missing and unexpected == ["unknown.weight"]


def test_load_state_dict_shape_mismatch_names_the_key_and_both_shapes() -> None:
    sd = Affine(3, 2).state_dict()
    with pytest.raises(ember.ShapeError, match=r"weight: checkpoint shape \(2, 3\), model shape \(2, 5\)"):
        Affine(5, 2).load_state_dict(sd, strict=False)


def test_to_device_moves_in_place_and_keeps_parameter_identity() -> None:
    net = Net()
    params = list(net.parameters())
    net.to(AD)
    assert [p for p in net.parameters()] == params and all(a is b for a, b in zip(net.parameters(), params))
    assert all(p.device is AD and p.requires_grad and p.is_leaf for p in params)
    assert net.enc[0].calls.device is AD and net.enc[0].calls.dtype is ember.int64
    x = ember.randn(5, 3, dtype=ember.float64, device=AD)
    net(x).sum().backward()
    assert net.enc[0].weight.grad.shape == (4, 3)
    net.zero_grad()
    assert net.enc[0].weight.grad is None


def test_to_dtype_casts_floating_tensors_only() -> None:
    net = Affine(2, 2).to(dtype=ember.float32)
    assert net.weight.dtype is ember.float32 and net.calls.dtype is ember.int64
    with pytest.raises(ember.DTypeError, match="only floating dtypes"):
        net.to(ember.int32)


def test_train_eval_apply_and_requires_grad() -> None:
    net = Net().eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen.count("Affine") == 6  # the tied child is visited twice, as in torch
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_assignment_rules_and_errors() -> None:
    m = Affine(2, 2)
    with pytest.raises(ember.DTypeError, match="cannot assign Tensor as parameter 'weight'"):
        m.weight = ember.zeros(2, 2)
    m.weight = None
    assert "weight" not in dict(m.named_parameters())

    class Early(nn.Module):
        def __init__(self) -> None:
            self.w = nn.Parameter(ember.zeros(1))

    with pytest.raises(ember.EmberError, match=r"before Module.__init__\(\) call"):
        Early()
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        m.nope  # noqa: B018
    with pytest.raises(ember.EmberError, match="has no forward"):
        nn.Module()(1)


def test_containers() -> None:
    seq = nn.Sequential(Affine(3, 4), Affine(4, 2))
    assert len(seq) == 2 and isinstance(seq[-1], Affine) and len(seq[:1]) == 1
    x = ember.randn(5, 3, dtype=ember.float64)
    np.testing.assert_allclose(seq(x).numpy(), seq[1](seq[0](x)).numpy())
    with pytest.raises(ember.IndexOutOfRangeError):
        seq[5]
    ml = nn.ModuleList([Affine(1, 1)])
    ml.append(Affine(1, 1)).extend([Affine(1, 1)])
    ml.insert(0, Affine(2, 2))
    assert [tuple(m.weight.shape) for m in ml] == [(2, 2), (1, 1), (1, 1), (1, 1)]
    md = nn.ModuleDict({"x": Affine(1, 1)})
    assert "x" in md and list(md.keys()) == ["x"]
    with pytest.raises(KeyError, match="no key 'y'"):
        md["y"]


def test_repr_shows_the_tree() -> None:
    assert repr(nn.Sequential(nn.Module())) == "Sequential(\n  (0): Module()\n)"


def test_parameter_pickle_and_deepcopy() -> None:
    p = nn.Parameter(ember.tensor([1.0, 2.0], device=AD))
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.tolist() == [1.0, 2.0]
    net = Net()
    clone = copy.deepcopy(net)
    assert clone.tied is clone.enc[0]  # sharing survives the copy
    clone.enc[0].weight.numpy()[0, 0] = 123.0
    assert net.enc[0].weight.numpy()[0, 0] != 123.0


def test_parameter_rejects_non_tensors_and_int_tensors_do_not_require_grad() -> None:
    with pytest.raises(ember.DTypeError, match="expected a Tensor"):
        nn.Parameter([1.0])
    assert not nn.Parameter(ember.tensor([1, 2])).requires_grad


def test_errors_inside_a_model_name_the_submodule_path_and_shapes() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 3), nn.Linear(5, 2)))
    with pytest.raises(ember.ShapeError, match=r"^Sequential\.2\.1 \(Linear\): .*last dim 5, got shape \(2, 3\)"):
        net(ember.randn(2, 4))
    with pytest.raises(ember.ShapeError, match=r"^Linear\(in_features=4"):  # called alone: no path to add
        nn.Linear(4, 8)(ember.randn(2, 5))
