"""ember.records: save/load round trips, dtype conversion, strict/non-strict loading, PyTorch import, key
remapping, typed errors, and atomic writes (a save killed with SIGKILL leaves the previous file intact)."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ember
from ember import records
from ember.errors import DTypeError, EmberError, ValueRangeError
from ember.nn import Module, Parameter
from ember.records import (
    CorruptRecordError,
    IncompatibleStateError,
    LoadReport,
    MissingDependencyError,
    RecordError,
    RecordNotFoundError,
)

RNG = np.random.default_rng(0)


def _arr(*shape: int, dtype: object = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


class Block(Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = Parameter(ember.tensor(_arr(n_out, n_in)))
        self.bias = Parameter(ember.tensor(_arr(n_out)))
        self.register_buffer("running_mean", ember.tensor(_arr(n_out)))
        self.register_buffer("num_batches_tracked", ember.tensor(7, dtype="int64"))
        self.register_buffer("scratch", ember.zeros(3), persistent=False)


class Net(Module):
    def __init__(self, hidden: int = 5) -> None:
        super().__init__()
        self.fc1 = Block(4, hidden)
        self.fc2 = Block(hidden, 2)
        self.scale = Parameter(ember.tensor(np.float32(1.5)))


def _np_state(sd: dict) -> dict[str, np.ndarray]:
    return {k: np.array(v.numpy()) for k, v in sd.items()}


def _assert_state_equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(np.asarray(a[k].numpy()), np.asarray(b[k].numpy()), err_msg=k)


def _tmp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".ember-tmp"))


# -- round trips -------------------------------------------------------------------------------------------------
def test_module_round_trip_preserves_keys_order_dtypes_and_values(tmp_path: Path) -> None:
    net = Net()
    path = tmp_path / "net.safetensors"
    records.save(net, path)
    loaded = records.load(path)
    assert isinstance(loaded, OrderedDict)
    expected = net.state_dict()
    assert "fc1.scratch" not in loaded  # non-persistent buffers are not saved
    _assert_state_equal(loaded, expected)
    assert loaded["fc1.num_batches_tracked"].dtype is ember.int64
    assert loaded["scale"].shape == ()

    fresh = Net()
    params_before = {k: id(p) for k, p in fresh.named_parameters()}
    report = records.load_into(fresh, path)
    assert report == LoadReport([], [], []) and report.clean
    _assert_state_equal(fresh.state_dict(), expected)
    # parameters are loaded in place: same objects, still trainable
    assert {k: id(p) for k, p in fresh.named_parameters()} == params_before
    assert all(p.requires_grad for p in fresh.parameters())


def test_loaded_tensors_do_not_alias_the_file_or_the_saved_module(tmp_path: Path) -> None:
    net = Net()
    path = tmp_path / "net.safetensors"
    records.save(net, path)
    loaded = records.load(path)
    before = np.array(net.fc1.weight.numpy())
    loaded["fc1.weight"].fill_(0.0)
    np.testing.assert_array_equal(net.fc1.weight.numpy(), before)
    records.save(net, path)  # overwriting the file must not change tensors already loaded from it
    assert float(loaded["fc1.weight"].abs().sum().item()) == 0.0


def test_files_are_plain_safetensors_readable_by_pytorch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    net = Net()
    path = tmp_path / "net.safetensors"
    records.save(net, path, dtype="bfloat16", metadata={"epoch": "3"})
    got = st_torch.load_file(str(path))
    assert set(got) == set(net.state_dict())
    w = torch.from_numpy(np.array(net.fc1.weight.numpy())).to(torch.bfloat16)
    assert got["fc1.weight"].dtype == torch.bfloat16
    assert torch.equal(got["fc1.weight"], w)
    assert got["fc1.num_batches_tracked"].dtype == torch.int64 and got["fc1.num_batches_tracked"].item() == 7
    meta = records.read_metadata(path)
    assert meta["epoch"] == "3" and meta["format"] == "pt" and meta["ember.kind"] == "state_dict"


def test_foreign_safetensors_file_loads(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    arrays = {"b": _arr(3), "a": np.arange(6, dtype=np.int32).reshape(2, 3), "m": np.array([True, False])}
    save_file(arrays, str(tmp_path / "x.safetensors"))
    loaded = records.load(tmp_path / "x.safetensors")
    assert sorted(loaded) == ["a", "b", "m"]
    for k, a in arrays.items():
        assert loaded[k].dtype is ember.dtypes.from_numpy_dtype(a.dtype)
        np.testing.assert_array_equal(loaded[k].numpy(), a)


def _optimizer_like_state() -> dict:
    return {
        "state": {
            0: {"step": 3, "exp_avg": ember.tensor(_arr(4, 3)), "exp_avg_sq": ember.tensor(_arr(4, 3) ** 2)},
            1: {"step": ember.tensor(3.0), "momentum_buffer": ember.tensor(_arr(2)), "flag": True},
            2: {},
        },
        "param_groups": [
            {"params": [0, 1], "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
             "amsgrad": False, "name": "decay", "maximize": None},
            {"params": [2], "lr": float("inf"), "betas": (0.5, float("nan")), "nested": [[1, 2.5], {"x": "y"}]},
        ],
        "counts": ember.tensor(np.arange(5, dtype=np.int64)),
        "mask": ember.tensor(np.array([True, False, True])),
        "empty": ember.zeros(0, 3),
        "host": np.arange(4, dtype=np.uint16),
        "a.b": ember.ones(2),  # collides with the flattened path of the next entry
        "a": {"b": ember.zeros(2)},
        (1, "t"): "tuple key",
        "__tensor__": 5,  # a key equal to one of the encoding's tags
        "big": 2**70,
        "neg": -0.0,
    }


def _assert_structure_equal(got: object, want: object, where: str = "<root>") -> None:
    if isinstance(want, ember.Tensor):
        assert isinstance(got, ember.Tensor), where
        assert got.dtype is want.dtype and got.shape == want.shape, where
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=where)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, where
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for k in want:
            _assert_structure_equal(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_structure_equal(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), where
    else:
        assert type(got) is type(want) and got == want, where
        if isinstance(want, float):
            assert math.copysign(1, got) == math.copysign(1, want), where


def test_nested_optimizer_state_round_trip(tmp_path: Path) -> None:
    state = _optimizer_like_state()
    path = tmp_path / "opt.safetensors"
    records.save(state, path)
    assert records.read_metadata(path)["ember.kind"] == "nested"
    _assert_structure_equal(records.load(path), state)


def test_object_with_state_dict_is_saved_through_it(tmp_path: Path) -> None:
    class FakeOptimizer:
        def state_dict(self) -> dict:
            return {"state": {0: {"v": ember.ones(3)}}, "param_groups": [{"params": [0], "lr": 0.1}]}

    records.save(FakeOptimizer(), tmp_path / "o.safetensors")
    _assert_structure_equal(records.load(tmp_path / "o.safetensors"), FakeOptimizer().state_dict())


def test_real_optimizer_state_round_trip(tmp_path: Path) -> None:
    optim = pytest.importorskip("ember.optim")
    if not hasattr(optim, "Adam"):
        pytest.skip("ember.optim.Adam not available yet")
    dev = ember.Device.flex().autodiff()
    net = Net().to(dev)
    opt = optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        loss = (net.fc1.weight * net.fc1.weight).sum() + net.fc2.bias.sum() * net.scale
        loss.backward()
        opt.step()
    path = tmp_path / "adam.safetensors"
    records.save(opt, path)
    _assert_structure_equal(records.load(path), opt.state_dict())
    opt2 = optim.Adam(Net().to(dev).parameters(), lr=1e-2)
    opt2.load_state_dict(records.load(path, device=dev))
    _assert_structure_equal(opt2.state_dict(), opt.state_dict())


def test_empty_state_dict_round_trip(tmp_path: Path) -> None:
    records.save({}, tmp_path / "e.safetensors")
    assert records.load(tmp_path / "e.safetensors") == OrderedDict()


def test_non_contiguous_and_zero_dim_tensors(tmp_path: Path) -> None:
    base = ember.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    sd = {"t": base.permute(1, 0), "s": ember.tensor(np.float64(2.5)), "z": ember.zeros(2, 0)}
    records.save(sd, tmp_path / "v.safetensors")
    got = records.load(tmp_path / "v.safetensors")
    np.testing.assert_array_equal(got["t"].numpy(), np.arange(12, dtype=np.float32).reshape(3, 4).T)
    assert got["s"].shape == () and got["s"].item() == 2.5
    assert got["z"].shape == (2, 0)


def test_autodiff_module_saves_and_loads_in_place(tmp_path: Path) -> None:
    dev = ember.Device.flex().autodiff()
    src = Net().to(dev)
    records.save(src, tmp_path / "n.safetensors")
    dst = Net().to(dev)
    records.load_into(dst, tmp_path / "n.safetensors")
    assert dst.fc1.weight.device == dev and dst.fc1.weight.requires_grad and dst.fc1.weight.is_leaf
    _assert_state_equal(dst.state_dict(), src.state_dict())
    loss = (dst.fc1.weight * 2).sum()
    loss.backward()
    np.testing.assert_array_equal(dst.fc1.weight.grad.numpy(), np.full((5, 4), 2, np.float32))


# -- dtype conversion --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_dtype_on_save_converts_floating_tensors_only(tmp_path: Path, name: str) -> None:
    torch = pytest.importorskip("torch")
    sd = {"w": ember.tensor(_arr(8, 8, dtype=np.float64)), "i": ember.tensor(np.arange(4, dtype=np.int32)),
          "b": ember.tensor(np.array([True, False]))}
    path = tmp_path / f"{name}.safetensors"
    records.save(sd, path, dtype=name)
    got = records.load(path)
    assert got["w"].dtype is ember.dtypes.as_dtype(name)
    assert got["i"].dtype is ember.int32 and got["b"].dtype is ember.bool_
    # oracle: PyTorch's rounding (round to nearest even) of the same values
    want = torch.from_numpy(sd["w"].numpy()).to(getattr(torch, name))
    want_np = want.float().numpy() if name == "bfloat16" else want.numpy()
    np.testing.assert_array_equal(got["w"].numpy().astype(want_np.dtype), want_np)
    assert os.path.getsize(path) >= 64 * ember.dtypes.as_dtype(name).itemsize


def test_dtype_on_save_shrinks_file(tmp_path: Path) -> None:
    sd = {"w": ember.tensor(_arr(64, 64))}
    records.save(sd, tmp_path / "f32.safetensors")
    records.save(sd, tmp_path / "f16.safetensors", dtype=ember.float16)
    assert os.path.getsize(tmp_path / "f32.safetensors") - os.path.getsize(tmp_path / "f16.safetensors") >= 64 * 64 * 2


def test_dtype_on_save_applies_to_nested_state(tmp_path: Path) -> None:
    state = {"state": {0: {"m": ember.tensor(_arr(3)), "n": ember.tensor(np.arange(3))}}}
    records.save(state, tmp_path / "o.safetensors", dtype="bfloat16")
    got = records.load(tmp_path / "o.safetensors")
    assert got["state"][0]["m"].dtype is ember.bfloat16 and got["state"][0]["n"].dtype is ember.int64


def test_dtype_on_load(tmp_path: Path) -> None:
    w = _arr(5, 3)
    sd = {"w": ember.tensor(w), "n": ember.tensor(np.arange(3, dtype=np.int64))}
    records.save(sd, tmp_path / "a.safetensors", dtype="bfloat16")
    got = records.load(tmp_path / "a.safetensors", dtype="float32")
    assert got["w"].dtype is ember.float32 and got["n"].dtype is ember.int64
    np.testing.assert_array_equal(got["w"].numpy(), w.astype(ml_dtypes.bfloat16).astype(np.float32))
    got64 = records.load(tmp_path / "a.safetensors", dtype=ember.float64)
    assert got64["w"].dtype is ember.float64


def test_load_on_device(tmp_path: Path) -> None:
    dev = ember.Device.flex().autodiff()
    records.save({"w": ember.ones(2)}, tmp_path / "a.safetensors")
    got = records.load(tmp_path / "a.safetensors", device=dev)
    assert got["w"].device == dev


def test_load_into_with_dtype_converts_module(tmp_path: Path) -> None:
    src = Net()
    records.save(src, tmp_path / "n.safetensors")
    dst = Net()
    records.load_into(dst, tmp_path / "n.safetensors", dtype="float16")
    assert dst.fc1.weight.dtype is ember.float16 and dst.fc1.running_mean.dtype is ember.float16
    assert dst.fc1.num_batches_tracked.dtype is ember.int64
    np.testing.assert_array_equal(dst.fc1.weight.numpy(), src.fc1.weight.numpy().astype(np.float16))


def test_load_into_casts_to_parameter_dtype_without_dtype(tmp_path: Path) -> None:
    src = Net()
    records.save(src, tmp_path / "n.safetensors", dtype="bfloat16")
    dst = Net()
    records.load_into(dst, tmp_path / "n.safetensors")
    assert dst.fc1.weight.dtype is ember.float32
    want = src.fc1.weight.numpy().astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(dst.fc1.weight.numpy(), want)


@pytest.mark.parametrize("bad", ["int32", ember.bool_, "uint8"])
def test_non_floating_dtype_is_rejected(tmp_path: Path, bad: object) -> None:
    records.save({"w": ember.ones(2)}, tmp_path / "a.safetensors")
    with pytest.raises(DTypeError, match="floating"):
        records.save({"w": ember.ones(2)}, tmp_path / "b.safetensors", dtype=bad)
    assert not (tmp_path / "b.safetensors").exists()
    with pytest.raises(DTypeError, match="floating"):
        records.load(tmp_path / "a.safetensors", dtype=bad)
    with pytest.raises(DTypeError, match="floating"):
        records.load_into(Net(), tmp_path / "a.safetensors", dtype=bad)


# -- strict / non-strict loading ---------------------------------------------------------------------------------
def _mismatched_checkpoint(tmp_path: Path) -> tuple[Path, Net]:
    src = Net(hidden=5)
    sd = src.state_dict()
    sd["fc2.weight"] = ember.tensor(_arr(2, 6))  # shape mismatch: the model has (2, 5)
    del sd["fc1.bias"]  # missing
    sd["extra.weight"] = ember.ones(3)  # unexpected
    path = tmp_path / "ckpt.safetensors"
    records.save(sd, path)
    return path, src


def test_strict_load_raises_listing_every_problem_and_changes_nothing(tmp_path: Path) -> None:
    path, _ = _mismatched_checkpoint(tmp_path)
    dst = Net(hidden=5)
    before = _np_state(dst.state_dict())
    with pytest.raises(IncompatibleStateError) as ei:
        records.load_into(dst, path)
    msg = str(ei.value)
    for part in ("fc1.bias", "extra.weight", "fc2.weight", "[2, 6]", "[2, 5]", "Net", str(path), "strict=False"):
        assert part in msg, part
    assert ei.value.report.missing_keys == ["fc1.bias"]
    assert ei.value.report.unexpected_keys == ["extra.weight"]
    assert ei.value.report.mismatched_keys == [("fc2.weight", (2, 6), (2, 5))]
    assert isinstance(ei.value, EmberError) and isinstance(ei.value, ValueError)
    after = _np_state(dst.state_dict())
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_non_strict_load_reports_and_loads_what_matches(tmp_path: Path) -> None:
    path, src = _mismatched_checkpoint(tmp_path)
    dst = Net(hidden=5)
    kept_bias = np.array(dst.fc1.bias.numpy())
    kept_w2 = np.array(dst.fc2.weight.numpy())
    report = records.load_into(dst, path, strict=False)
    assert report.missing_keys == ["fc1.bias"]
    assert report.unexpected_keys == ["extra.weight"]
    assert report.mismatched_keys == [("fc2.weight", (2, 6), (2, 5))]
    assert not report.clean and "fc2.weight" in report.describe()
    np.testing.assert_array_equal(dst.fc1.bias.numpy(), kept_bias)  # missing: untouched
    np.testing.assert_array_equal(dst.fc2.weight.numpy(), kept_w2)  # mismatched: untouched
    for k in ("fc1.weight", "fc1.running_mean", "fc2.bias", "scale", "fc2.num_batches_tracked"):
        np.testing.assert_array_equal(dst.state_dict()[k].numpy(), src.state_dict()[k].numpy(), err_msg=k)


def test_load_into_with_key_map(tmp_path: Path) -> None:
    src = Net()
    sd = OrderedDict((f"model.{k}".replace("fc", "layer"), v) for k, v in src.state_dict().items())
    sd["model.aux"] = ember.ones(1)
    records.save(sd, tmp_path / "m.safetensors")
    dst = Net()
    report = records.load_into(dst, tmp_path / "m.safetensors",
                               key_map=[(r"^model\.", ""), (r"^aux$", None), (r"layer(\d)", r"fc\1")])
    assert report.clean
    _assert_state_equal(dst.state_dict(), src.state_dict())


def test_load_into_rejects_non_modules_and_nested_records(tmp_path: Path) -> None:
    records.save({"state": {0: {"m": ember.ones(2)}}}, tmp_path / "o.safetensors")
    with pytest.raises(RecordError, match="nested state"):
        records.load_into(Net(), tmp_path / "o.safetensors")
    with pytest.raises(DTypeError, match="nn.Module"):
        records.load_into({"a": 1}, tmp_path / "o.safetensors")
    with pytest.raises(DTypeError, match="strict"):
        records.load_into(Net(), tmp_path / "o.safetensors", strict="yes")


# -- key remapping -----------------------------------------------------------------------------------------------
def test_remap_keys_rules_in_order_and_dropping() -> None:
    state = OrderedDict([("module.encoder.0.weight", 1), ("module.encoder.0.bias", 2), ("module.head.w", 3),
                         ("module.tmp", 4), ("other", 5)])
    out = records.remap_keys(state, [(r"^module\.", ""), (r"encoder\.(\d+)", r"layers.\1"),
                                     (r"^head\..*", None), (r"^tmp$", "")])
    assert list(out.items()) == [("layers.0.weight", 1), ("layers.0.bias", 2), ("other", 5)]
    # order matters: a rule sees the output of the previous one
    assert list(records.remap_keys({"ab": 0}, [("a", "b"), ("bb", "c")])) == ["c"]
    assert list(records.remap_keys({"ab": 0}, [("bb", "c"), ("a", "b")])) == ["bb"]
    assert list(records.remap_keys({"x.y": 0}, {r"\.": "_"})) == ["x_y"]  # a mapping works too


def test_remap_keys_errors() -> None:
    with pytest.raises(ValueRangeError, match=r"'a\.w' and 'b\.w' are both mapped to 'w'"):
        records.remap_keys({"a.w": 0, "b.w": 1}, [(r"^[ab]\.", "")])
    with pytest.raises(ValueRangeError, match="valid regular expression"):
        records.remap_keys({"a": 0}, [("(", "x")])
    with pytest.raises(ValueRangeError, match="invalid"):
        records.remap_keys({"a": 0}, [("a", r"\2")])
    with pytest.raises(DTypeError, match="regex"):
        records.remap_keys({"a": 0}, [("a", 3)])
    with pytest.raises(DTypeError, match="pairs"):
        records.remap_keys({"a": 0}, "a->b")
    with pytest.raises(DTypeError, match="pairs"):
        records.remap_keys({"a": 0}, 5)


# -- PyTorch import ----------------------------------------------------------------------------------------------
def _torch_model():  # noqa: ANN202 - torch is optional
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    m(torch.randn(8, 4))  # updates the running stats
    return torch, m


def test_import_torch_pt_with_key_map(tmp_path: Path) -> None:
    torch, m = _torch_model()
    sd = m.state_dict()
    sd["half"] = torch.randn(3).to(torch.bfloat16)
    path = tmp_path / "model.pt"
    torch.save(sd, path)
    got = records.import_torch_weights(path, key_map=[(r"^0\.", "fc1."), (r"^2\.", "fc2."), (r"^1\.", "bn."),
                                                      (r"num_batches_tracked$", None)])
    assert list(got) == ["fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                         "fc2.weight", "fc2.bias", "half"]
    np.testing.assert_array_equal(got["fc1.weight"].numpy(), sd["0.weight"].numpy())
    np.testing.assert_array_equal(got["bn.running_var"].numpy(), sd["1.running_var"].numpy())
    assert got["half"].dtype is ember.bfloat16
    np.testing.assert_array_equal(got["half"].numpy().astype(np.float32), sd["half"].float().numpy())
    plain = records.import_torch_weights(tmp_path / "model.pt")
    assert plain["1.num_batches_tracked"].dtype is ember.int64 and plain["1.num_batches_tracked"].item() == 1


def test_import_torch_weights_load_into_matches_torch_forward(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    tm = torch.nn.Linear(4, 3)
    torch.save(tm.state_dict(), tmp_path / "lin.pth")

    class Lin(Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = Parameter(ember.zeros(3, 4))
            self.bias = Parameter(ember.zeros(3))

    em = Lin()
    em.load_state_dict(records.import_torch_weights(tmp_path / "lin.pth"))
    x = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    got = (ember.tensor(x) @ em.weight.permute(1, 0) + em.bias).numpy()
    want = tm(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_import_torch_checkpoint_wrapper_and_device_dtype(tmp_path: Path) -> None:
    torch, m = _torch_model()
    torch.save({"epoch": 3, "state_dict": m.state_dict(), "optimizer": {"lr": 0.1}}, tmp_path / "ckpt.ckpt")
    dev = ember.Device.flex().autodiff()
    got = records.import_torch_weights(tmp_path / "ckpt.ckpt", dtype="float64", device=dev)
    assert got["0.weight"].dtype is ember.float64 and got["0.weight"].device == dev
    assert got["1.num_batches_tracked"].dtype is ember.int64
    np.testing.assert_allclose(got["0.weight"].numpy(), m.state_dict()["0.weight"].double().numpy())


def test_import_torch_rejects_non_state_dicts(tmp_path: Path) -> None:
    torch, m = _torch_model()
    torch.save(m, tmp_path / "whole.pt")  # a pickled module: not loadable with weights_only=True
    with pytest.raises(RecordError, match=r"state_dict\(\)") as ei:
        records.import_torch_weights(tmp_path / "whole.pt")
    assert "whole.pt" in str(ei.value)
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "meta.pt")
    with pytest.raises(RecordError, match=r"not a state dict.*'epoch'"):
        records.import_torch_weights(tmp_path / "meta.pt")
    torch.save({"w": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "c.pt")
    with pytest.raises(DTypeError, match=r"'w'.*complex64"):
        records.import_torch_weights(tmp_path / "c.pt")


def test_import_safetensors_written_by_torch_with_key_map(tmp_path: Path) -> None:
    torch, m = _torch_model()
    st_torch = pytest.importorskip("safetensors.torch")
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    sd["emb"] = torch.randn(4, 2).to(torch.bfloat16)
    st_torch.save_file(sd, str(tmp_path / "model.safetensors"))
    got = records.import_torch_weights(tmp_path / "model.safetensors", key_map=[(r"^(\d)\.", r"layers.\1.")])
    assert set(got) == {"layers." + k if k[0].isdigit() else k for k in sd}
    np.testing.assert_array_equal(got["layers.2.weight"].numpy(), sd["2.weight"].numpy())
    assert got["emb"].dtype is ember.bfloat16
    np.testing.assert_array_equal(got["emb"].numpy().astype(np.float32), sd["emb"].float().numpy())


def test_import_without_torch_names_pip_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04 not really a zip")
    records.save({"w": ember.ones(2)}, tmp_path / "ok.safetensors")
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(MissingDependencyError, match="pip install torch") as ei:
        records.import_torch_weights(tmp_path / "model.pt")
    assert isinstance(ei.value, ImportError) and isinstance(ei.value, EmberError)
    assert "model.pt" in str(ei.value)
    # safetensors files need no torch
    assert records.import_torch_weights(tmp_path / "ok.safetensors")["w"].shape == (2,)


def test_import_corrupt_torch_file(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04garbage" * 10)
    with pytest.raises(CorruptRecordError, match="bad.pt"):
        records.import_torch_weights(tmp_path / "bad.pt")


def test_import_sniffs_format_without_a_known_suffix(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2)}, tmp_path / "weights.data")
    records.save({"v": ember.zeros(3)}, tmp_path / "other.data")
    assert list(records.import_torch_weights(tmp_path / "weights.data")) == ["w"]
    assert list(records.import_torch_weights(tmp_path / "other.data")) == ["v"]


# -- errors ------------------------------------------------------------------------------------------------------
def test_missing_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.safetensors"
    for fn in (records.load, records.read_metadata, records.import_torch_weights,
               lambda p: records.load_into(Net(), p)):
        with pytest.raises(RecordNotFoundError) as ei:
            fn(missing)
        assert isinstance(ei.value, FileNotFoundError) and isinstance(ei.value, EmberError)
        assert str(missing) in str(ei.value) and ei.value.filename == str(missing)
    with pytest.raises(RecordNotFoundError, match="does not exist"):
        records.save({"w": ember.ones(1)}, tmp_path / "no_dir" / "x.safetensors")
    with pytest.raises(RecordError, match="directory"):
        records.load(tmp_path)
    with pytest.raises(RecordError, match="directory"):
        records.save({"w": ember.ones(1)}, tmp_path)


@pytest.mark.parametrize("content", [b"", b"garbage", b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}"])
def test_corrupt_file_errors_name_the_path(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(CorruptRecordError) as ei:
        records.load(path)
    assert str(path) in str(ei.value) and isinstance(ei.value, EmberError)


def test_truncated_file_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    records.save({"w": ember.tensor(_arr(100))}, path)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(CorruptRecordError, match=re.escape(str(path))):
        records.load(path)


def test_torch_file_given_to_load_is_corrupt(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pt")
    with pytest.raises(CorruptRecordError, match="safetensors"):
        records.load(tmp_path / "m.pt")


def test_bad_ember_metadata_is_corrupt(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "a.safetensors"),
              metadata={"ember.kind": "nested", "ember.structure": "{not json"})
    with pytest.raises(CorruptRecordError, match="metadata"):
        records.load(tmp_path / "a.safetensors")
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "b.safetensors"),
              metadata={"ember.kind": "nested", "ember.structure": '{"x": {"__tensor__": "missing"}}'})
    with pytest.raises(CorruptRecordError, match="missing"):
        records.load(tmp_path / "b.safetensors")
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "c.safetensors"),
              metadata={"ember.kind": "state_dict", "ember.keys": '["w", "v"]'})
    with pytest.raises(CorruptRecordError, match="key list"):
        records.load(tmp_path / "c.safetensors")


def test_unsupported_stored_dtype_names_the_key(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"u": np.ones(2, np.uint32)}, str(tmp_path / "u.safetensors"))
    with pytest.raises(DTypeError, match="uint32"):
        records.load(tmp_path / "u.safetensors")
    with pytest.raises(DTypeError, match="'u'"):
        records.import_torch_weights(tmp_path / "u.safetensors")


def test_save_argument_errors(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    with pytest.raises(DTypeError, match="nn.Module"):
        records.save([1, 2], p)
    with pytest.raises(DTypeError, match=r"object at state\.0\.obj"):
        records.save({"state": {0: {"obj": object()}}}, p)
    with pytest.raises(DTypeError, match="str to str"):
        records.save({"w": ember.ones(1)}, p, metadata={"epoch": 3})
    with pytest.raises(DTypeError, match="dict"):
        records.save({"w": ember.ones(1)}, p, metadata=["a"])
    with pytest.raises(ValueRangeError, match="reserved"):
        records.save({"w": ember.ones(1)}, p, metadata={"ember.kind": "x"})
    with pytest.raises(DTypeError, match="safetensors cannot store"):
        records.save({"c": np.ones(2, np.complex128)}, p)
    with pytest.raises(DTypeError, match="path"):
        records.save({"w": ember.ones(1)}, 3)
    assert not p.exists() and _tmp_files(tmp_path) == []


# -- atomic writes -----------------------------------------------------------------------------------------------
def test_failed_save_leaves_previous_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.safetensors"
    good = {"w": ember.tensor(_arr(10))}
    records.save(good, path)
    real = records._write_safetensors

    def boom(f, arrays, meta):  # noqa: ANN001, ANN202
        real(f, arrays, meta)
        raise KeyboardInterrupt  # even an interrupt after the data went out must not reach the target

    monkeypatch.setattr(records, "_write_safetensors", boom)
    with pytest.raises(KeyboardInterrupt):
        records.save({"w": ember.tensor(_arr(10))}, path)
    _assert_state_equal(records.load(path), good)
    assert _tmp_files(tmp_path) == []


def test_overwrite_keeps_permissions(tmp_path: Path) -> None:
    if os.name == "nt":
        pytest.skip("POSIX permissions")
    path = tmp_path / "m.safetensors"
    records.save({"w": ember.ones(1)}, path)
    os.chmod(path, 0o640)
    records.save({"w": ember.zeros(1)}, path)
    assert (os.stat(path).st_mode & 0o777) == 0o640
    assert records.load(path)["w"].item() == 0.0


def test_save_writes_through_symlinks(tmp_path: Path) -> None:
    if os.name == "nt":
        pytest.skip("symlinks need privileges on Windows")
    real = tmp_path / "real.safetensors"
    link = tmp_path / "link.safetensors"
    records.save({"w": ember.ones(1)}, real)
    link.symlink_to(real)
    records.save({"w": ember.zeros(1)}, link)
    assert link.is_symlink() and records.load(real)["w"].item() == 0.0


_HANG_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import ember
    from ember import records

    path = sys.argv[1]
    records.save({"w": ember.tensor(np.arange(1000, dtype=np.float32))}, path)  # the last good save
    real = records._write_safetensors

    class Hang:
        def __init__(self, f):
            self.f, self.n = f, 0
        def write(self, b):
            self.f.write(b)
            self.n += 1
            if self.n == 3:  # length, header and the first tensor are out: stop here until killed
                self.f.flush()
                print("mid-write", flush=True)
                time.sleep(600)

    records._write_safetensors = lambda f, arrays, meta: real(Hang(f), arrays, meta)
    big = {k: ember.tensor(np.full(250_000, i, dtype=np.float32)) for i, k in enumerate("abcdefgh")}
    records.save(big, path)
    print("finished", flush=True)
""")


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL is POSIX")
def test_save_killed_mid_write_leaves_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    proc = subprocess.Popen([sys.executable, "-c", _HANG_SCRIPT, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "mid-write", line
        temps = _tmp_files(tmp_path)
        assert len(temps) == 1 and os.path.getsize(tmp_path / temps[0]) > 0  # the kill really lands mid-write
        assert re.fullmatch(r"\.model\.safetensors\.\d+\.[0-9a-f]{16}\.ember-tmp", temps[0])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    got = records.load(path)
    assert list(got) == ["w"]
    np.testing.assert_array_equal(got["w"].numpy(), np.arange(1000, dtype=np.float32))
    # the target name only ever holds complete files; the dead writer's temporary file is cleaned by the next save
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".ember-tmp")) == ["model.safetensors"]
    records.save({"w": ember.ones(3)}, path)
    assert _tmp_files(tmp_path) == []
    assert records.load(path)["w"].shape == (3,)


_LOOP_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import ember
    from ember import records

    path = sys.argv[1]
    real = records._write_safetensors

    class Slow:  # many small writes: the write phase, not fsync, dominates, so kills land mid-write
        def __init__(self, f):
            self.f = f
        def write(self, b):
            mv = memoryview(b).cast("B")
            for i in range(0, len(mv), 1 << 18):
                self.f.write(mv[i:i + (1 << 18)])
                time.sleep(0.002)

    records._write_safetensors = lambda f, arrays, meta: real(Slow(f), arrays, meta)
    version = 0
    while True:
        version += 1
        big = {"version": ember.tensor(np.int64(version)),
               "w": ember.tensor(np.full(4_000_000, version, dtype=np.float32))}
        records.save(big, path, metadata={"version": str(version)})
        print(version, flush=True)
""")


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL is POSIX")
def test_repeated_saves_killed_at_random_leave_a_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "loop.safetensors"
    rng = np.random.default_rng(7)
    caught_mid_write = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _LOOP_SCRIPT, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip().isdigit()  # at least one good save exists
            deadline = time.monotonic() + rng.uniform(0.05, 0.4)
            while time.monotonic() < deadline or not _tmp_files(tmp_path):
                if time.monotonic() > deadline + 20:
                    break
            if _tmp_files(tmp_path):
                caught_mid_write += 1
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        printed = [int(v) for v in proc.stdout.read().split()]
        proc.stdout.close()
        got = records.load(path)
        version = int(got["version"].item())
        assert records.read_metadata(path)["version"] == str(version)
        np.testing.assert_array_equal(got["w"].numpy(), np.full(4_000_000, version, dtype=np.float32))
        if printed:  # the file is the last reported save or the one after it (replaced, not yet reported)
            assert version in (printed[-1], printed[-1] + 1)
    assert caught_mid_write >= 1
    records.save({"w": ember.ones(1)}, path)  # cleans what the killed writers left
    assert _tmp_files(tmp_path) == []


def test_temp_files_of_live_writers_are_kept(tmp_path: Path) -> None:
    if os.name == "nt":
        pytest.skip("pid liveness check is POSIX-only")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [f".m.safetensors.{os.getpid()}.{'a' * 16}.ember-tmp",  # this process: maybe another thread's save
             f".m.safetensors.{dead.pid}.{'b' * 16}.ember-tmp",  # writer gone: stale
             f".m.safetensors.1.{dead.pid}.{'c' * 16}.ember-tmp",  # target "m.safetensors.1": not ours
             ".m.safetensors.tmp"]  # not our pattern
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    records.save({"w": ember.ones(1)}, tmp_path / "m.safetensors")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert names[1] not in left
    assert {names[0], names[2], names[3], "m.safetensors"} == set(left)


def test_lazy_attribute() -> None:
    assert ember.records is records
    assert issubclass(RecordNotFoundError, FileNotFoundError) and issubclass(CorruptRecordError, RecordError)


# -- nesting depth -----------------------------------------------------------------------------------------------
def _nested_file(path: Path, key: str, text: str) -> None:
    from safetensors.numpy import save_file

    kind = "nested" if key == "ember.structure" else "state_dict"
    save_file({"w": np.ones(2, np.float32)}, str(path), metadata={"ember.kind": kind, key: text})


@pytest.mark.parametrize("depth", [records.MAX_DEPTH + 1, 900, 100_000])
@pytest.mark.parametrize("key", ["ember.structure", "ember.keys"])
def test_deeply_nested_metadata_is_corrupt_not_recursion(tmp_path: Path, key: str, depth: int) -> None:
    path = tmp_path / "deep.safetensors"
    _nested_file(path, key, "[" * depth + "]" * depth)
    for fn in (records.load, lambda p: records.load_into(Net(), p)):
        with pytest.raises(CorruptRecordError) as ei:
            fn(path)
        assert str(path) in str(ei.value) and f"nested {depth} levels deep" in str(ei.value)
        assert key in str(ei.value)


def test_tagged_nesting_counts_too(tmp_path: Path) -> None:
    # tuples and non-string-keyed dicts are stored in tagged forms; their levels count towards the bound
    inner = "1"
    for _ in range(40):
        inner = '{"__tuple__": [' + inner + "]}"
    path = tmp_path / "t.safetensors"
    _nested_file(path, "ember.structure", inner)
    with pytest.raises(CorruptRecordError, match="nested 80 levels deep"):
        records.load(path)


def test_nesting_at_the_bound_loads_and_brackets_in_strings_do_not_count(tmp_path: Path) -> None:
    depth = records.MAX_DEPTH
    path = tmp_path / "ok.safetensors"
    _nested_file(path, "ember.structure", "[" * (depth - 1) + '"]]][[[{{{"' + "]" * (depth - 1))
    value = records.load(path)
    for _ in range(depth - 1):
        value = value[0]
    assert value == "]]][[[{{{"


def test_save_refuses_structures_load_would_refuse(tmp_path: Path) -> None:
    deep: dict = {}
    cur = deep
    for _ in range(records.MAX_DEPTH + 5):
        cur["a"] = {}
        cur = cur["a"]
    with pytest.raises(ValueRangeError, match=f"deeper than {records.MAX_DEPTH} levels"):
        records.save({"x": deep}, tmp_path / "d.safetensors")
    tuples: object = 1
    for _ in range(records.MAX_DEPTH // 2 + 1):  # each tuple is two JSON levels: within the path bound, past JSON's
        tuples = (tuples,)
    with pytest.raises(ValueRangeError, match="deeper than"):
        records.save({"t": tuples}, tmp_path / "d.safetensors")
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_safetensors_file_without_its_suffix_is_told_from_a_torch_file_by_its_header(tmp_path: Path) -> None:
    """Regression: a header length whose first byte is 0x80 (384 bytes, say) looked like a pickle's protocol byte,
    so a suffix-less safetensors file was handed to torch."""
    from safetensors.numpy import save_file

    from ember.records import import_torch_weights

    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "weights"  # no suffix (.bin would say torch)
    for pad in range(400):  # grow the metadata until the header length's low byte is 0x80
        save_file({"w": arr}, str(path), metadata={"pad": "x" * pad})
        if path.read_bytes()[0] == 0x80:
            break
    else:
        pytest.fail("no padding gave a header length with low byte 0x80")
    out = import_torch_weights(path)
    np.testing.assert_array_equal(out["w"].numpy(), arr)
    (tmp_path / "junk").write_bytes(b"PK\x03\x04" + bytes(20))
    with pytest.raises(ember.EmberError):
        import_torch_weights(tmp_path / "junk")
