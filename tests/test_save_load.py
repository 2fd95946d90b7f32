"""ember.save / ember.load: torch.save/torch.load-style checkpoints (safetensors, never pickle) on every device."""

from __future__ import annotations

import io
import os
import pathlib
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import nn, records
from ember.errors import DeviceError, DTypeError, EmberError, UnsupportedError
from ember.records import CorruptRecordError, RecordNotFoundError

DEVICES = ["flex", "flex+autodiff", "toy"]


def _np(t: ember.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _assert_same(a: Any, b: Any, device: ember.Device) -> None:
    """Structure, types and values equal; every tensor of ``b`` on ``device``."""
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (type(a), type(b))
    if isinstance(a, ember.Tensor):
        assert b.device == device and b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(_np(b).astype(np.float64), _np(a).astype(np.float64))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k], device)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y, device)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b or (a != a and b != b)


def _nested(device: ember.Device) -> dict[Any, Any]:
    rng = np.random.default_rng(0)
    base = ember.tensor(rng.standard_normal((4, 6)).astype(np.float32), device=device)
    return {
        "w": base,
        "view": base[:, 1:5:2],  # non-contiguous view: saved as its values
        "t": base.T,
        "half": ember.tensor(rng.standard_normal(5).astype(np.float32), device=device).to(ember.bfloat16),
        "f16": ember.tensor([1.5, -2.0], device=device).to(ember.float16),
        "i64": ember.tensor(np.arange(6, dtype=np.int64).reshape(2, 3), device=device),
        "flags": ember.tensor([True, False], device=device),
        "scalar": ember.tensor(3.25, device=device),
        "empty": ember.tensor(np.zeros((0, 3), np.float32), device=device),
        "layers": [{"w": base, "b": None}, ("x", 1, 2.5, True, None, float("inf"))],
        3: {"step": 7, (1, "a"): "tuple key"},
        "__tensor__": "a key that looks like a tag",
        "np": np.arange(3, dtype=np.int32),
    }


@pytest.mark.parametrize("spec", DEVICES)
@pytest.mark.parametrize("target", ["bytesio", "path", "pathlike", "fileobj"])
def test_nested_round_trip(spec: str, target: str, tmp_path: pathlib.Path) -> None:
    device = ember.Device.parse(spec)
    state = _nested(device)
    path = tmp_path / "ckpt.safetensors"
    if target == "bytesio":
        buf = io.BytesIO()
        ember.save(state, buf)
        buf.seek(0)
        out = ember.load(buf, map_location=spec)
    elif target == "fileobj":
        with open(path, "wb") as f:
            ember.save(state, f)
        with open(path, "rb") as f:
            out = ember.load(f, map_location=device)
    else:
        ember.save(state, str(path) if target == "path" else path)
        out = ember.load(str(path) if target == "path" else path, map_location=device)
    _assert_same(state, out, device)
    assert out["w"] is out["layers"][0]["w"]  # shared tensors come back shared
    assert out["t"] is not out["w"]  # a view is its own value
    np.testing.assert_array_equal(_np(out["view"]), _np(state["w"])[:, 1:5:2])


@pytest.mark.parametrize("spec", DEVICES)
def test_flat_state_dict_is_plain_safetensors(spec: str, tmp_path: pathlib.Path) -> None:
    device = ember.Device.parse(spec)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)).to(device)
    sd = model.state_dict()
    path = tmp_path / "m.safetensors"
    ember.save(sd, path)
    out = ember.load(path, map_location=device)
    assert list(out) == list(sd)  # the module's order, not safetensors' sorted one
    _assert_same(dict(sd), dict(out), device)
    # torch oracle: torch's own safetensors reader and a torch model with the same layout
    from safetensors.torch import load_file

    tsd = load_file(str(path))
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    tmodel.load_state_dict(tsd)
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(_np(model(ember.tensor(x, device=device))), tmodel(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    # records reads what ember.save writes
    _assert_same(dict(sd), dict(records.load(path, device=device)), device)


def test_reads_torch_written_safetensors_and_records_files(tmp_path: pathlib.Path) -> None:
    from safetensors.torch import save_file

    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}
    save_file(t, str(tmp_path / "t.safetensors"))
    out = ember.load(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(_np(out["a"]), t["a"].numpy())
    assert out["b"].dtype == ember.bfloat16
    np.testing.assert_array_equal(_np(out["b"]).astype(np.float32), t["b"].float().numpy())
    nested = {"state": {0: {"step": 2, "m": ember.tensor([1.0, 2.0])}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    records.save(nested, tmp_path / "r.safetensors")
    with open(tmp_path / "r.safetensors", "rb") as f:
        _assert_same(nested, ember.load(f), ember.default_device())


def test_map_location_forms(tmp_path: pathlib.Path) -> None:
    buf = io.BytesIO()
    ember.save({"x": ember.tensor([1.0, 2.0])}, buf)
    data = buf.getvalue()
    host = ember.Device.host()
    assert ember.load(io.BytesIO(data))["x"].device == ember.default_device()
    assert ember.load(io.BytesIO(data), map_location="cpu")["x"].device == host
    assert ember.load(io.BytesIO(data), map_location={"cuda:0": "cpu"})["x"].device == host
    ad = ember.Device.parse("flex+autodiff")
    assert ember.load(io.BytesIO(data), map_location={"a": ad, "b": "flex+autodiff"})["x"].device == ad
    assert ember.load(io.BytesIO(data), weights_only=True)["x"].device == ember.default_device()
    with pytest.raises(UnsupportedError, match="function"):
        ember.load(io.BytesIO(data), map_location=lambda s, loc: s)
    with pytest.raises(UnsupportedError, match="several devices"):
        ember.load(io.BytesIO(data), map_location={"cuda:0": "flex", "cuda:1": "toy"})
    with pytest.raises(DeviceError, match="map_location"):
        ember.load(io.BytesIO(data), map_location=3)
    with pytest.raises(EmberError, match="nosuch"):  # PluginError: no backend of that name
        ember.load(io.BytesIO(data), map_location="nosuch")


def _train(model: nn.Module, opt: ember.optim.Optimizer, data: list[tuple[np.ndarray, np.ndarray]],
           device: ember.Device) -> list[float]:
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(ember.tensor(x, device=device)), ember.tensor(y, device=device))
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses


def test_adam_checkpoint_resumes_identically(tmp_path: pathlib.Path) -> None:
    device = ember.Device.parse("flex+autodiff")
    rng = np.random.default_rng(2)
    data = [(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32))
            for _ in range(6)]

    def make() -> tuple[nn.Module, ember.optim.Optimizer]:
        ember.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)).to(device)
        return m, ember.optim.Adam(m.parameters(), lr=1e-2)

    model, opt = make()
    _train(model, opt, data[:3], device)
    path = tmp_path / "ckpt.pt"
    ember.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, path)
    expected = _train(model, opt, data[3:], device)

    model2, opt2 = make()
    ckpt = ember.load(path, map_location="cpu")
    assert ckpt["epoch"] == 3 and isinstance(ckpt["optimizer"]["state"][0]["exp_avg"], ember.Tensor)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    assert _train(model2, opt2, data[3:], device) == expected
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        np.testing.assert_array_equal(_np(a), _np(b), err_msg=k)


@pytest.mark.parametrize("spec", DEVICES)
def test_tied_weights_stay_tied(spec: str) -> None:
    device = ember.Device.parse(spec)
    emb = nn.Embedding(5, 3)
    dec = nn.Linear(3, 5, bias=False)
    dec.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "dec": dec}).to(device)
    sd = model.state_dict()
    for state in ({"model": sd, "extra": [model.state_dict()["emb.weight"]]}, sd):
        buf = io.BytesIO()
        ember.save(state, buf)
        buf.seek(0)
        out = ember.load(buf, map_location=device)
        flat = out["model"] if "model" in out else out
        assert flat["emb.weight"] is flat["dec.weight"]
        np.testing.assert_array_equal(_np(flat["emb.weight"]), _np(model.emb.weight))
        assert sorted(flat) == sorted(sd)
    assert out is not None and list(out) == list(sd)  # the flat dict keeps its key order
    # distinct tensors with equal values stay distinct
    twins = {"a": ember.zeros(3, device=device), "b": ember.zeros(3, device=device)}
    buf = io.BytesIO()
    ember.save(twins, buf)
    buf.seek(0)
    out = ember.load(buf)
    assert out["a"] is not out["b"]


# -- bad input ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("obj", "message"), [
    ({"layers": [0, 1, {"w": {1, 2}}]}, r"save: obj\['layers'\]\[2\]\['w'\] is a set"),
    ({"m": nn.Linear(2, 2)}, r"obj\['m'\] is an nn.Module \(Linear\).*model.state_dict\(\)"),
    (nn.Linear(2, 2), r"obj is an nn.Module \(Linear\).*save model.state_dict\(\)"),
    (object(), r"obj is a object; ember.save stores tensors"),
    ({"f": print}, r"obj\['f'\] is a builtin_function_or_method"),
    ({ember.tensor(1.0): 1}, r"obj has a key .* of type Tensor"),
    ({"a": np.array([object()])}, r"obj\['a'\] is a numpy array of dtype object"),
    ("just a string", r"obj is a str"),
], ids=["set", "nested-module", "module", "object", "function", "tensor-key", "object-array", "string"])
def test_save_refuses_unstorable(obj: Any, message: str, tmp_path: pathlib.Path) -> None:
    with pytest.raises(DTypeError, match=message):
        ember.save(obj, io.BytesIO())
    with pytest.raises(DTypeError, match=message):
        ember.save(obj, tmp_path / "x.safetensors")
    assert not os.listdir(tmp_path)  # nothing written


def test_save_refuses_optimizer_object() -> None:
    opt = ember.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(DTypeError, match=r"obj is a SGD object; save its state_dict\(\)"):
        ember.save(opt, io.BytesIO())


def test_save_bad_targets(tmp_path: pathlib.Path) -> None:
    with pytest.raises(DTypeError, match="text mode"):
        with open(tmp_path / "t.txt", "w") as f:
            ember.save({}, f)
    with pytest.raises(DTypeError, match="got int"):
        ember.save({}, 3)
    with pytest.raises(RecordNotFoundError, match="does not exist"):
        ember.save({}, tmp_path / "missing" / "x.safetensors")


@pytest.mark.parametrize("kind", ["random", "torch-zip", "torch-legacy", "empty", "truncated", "header-only"])
@pytest.mark.parametrize("source", ["path", "bytesio"])
def test_load_refuses_foreign_files(kind: str, source: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / f"{kind}.bin"
    if kind == "random":
        path.write_bytes(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif kind == "torch-zip":
        torch.save({"w": torch.ones(3)}, path)
    elif kind == "torch-legacy":
        torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=False)
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        buf = io.BytesIO()
        ember.save({"w": ember.tensor(np.ones(64, np.float32))}, buf)
        data = buf.getvalue()
        path.write_bytes(data[:-10] if kind == "truncated" else data[:8 + int.from_bytes(data[:8], "little")])
    match = "PyTorch .*import_torch_weights" if kind.startswith("torch") else "not a .*safetensors file"
    if source == "path":
        with pytest.raises(CorruptRecordError, match=match) as info:
            ember.load(path)
        assert str(path) in str(info.value)
    else:
        with pytest.raises(CorruptRecordError, match=match):
            ember.load(io.BytesIO(path.read_bytes()))


def test_load_bad_sources(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RecordNotFoundError):
        ember.load(tmp_path / "nope.safetensors")
    with pytest.raises(EmberError, match="directory"):
        ember.load(tmp_path)
    (tmp_path / "t.txt").write_text("hello")
    with open(tmp_path / "t.txt") as f:
        with pytest.raises(DTypeError, match="text mode"):
            ember.load(f)
    with pytest.raises(DTypeError, match="got int"):
        ember.load(3)
    with pytest.raises(DTypeError, match="weights_only"):
        ember.load(io.BytesIO(), weights_only="yes")
