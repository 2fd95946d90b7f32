"""ember.manual_seed seeds every stream a program draws from (device streams, now and when first used, and the host
generator a DataLoader takes its shuffle seed from); ember.device(...) is callable like torch.device; ember.utils.data
re-exports ember_train.data for ports."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib import metadata

import numpy as np
import pytest

import ember
from ember import Device, DeviceError, PluginError, ValueRangeError
from ember import device as device_mod
from ember.plugins import manager

pytest.importorskip("ember_flex")


@pytest.fixture(autouse=True)
def global_seed_state() -> Iterator[None]:
    """The global seed state is restored after each test, so other tests see what they saw before."""
    saved = (device_mod._global_seed, device_mod._initial_seed, device_mod._host_rng,
             dict(device_mod._seeded_backends))
    try:
        yield
    finally:
        (device_mod._global_seed, device_mod._initial_seed, device_mod._host_rng) = saved[:3]
        device_mod._seeded_backends.clear()
        device_mod._seeded_backends.update(saved[3])


@pytest.fixture
def autodiff() -> None:
    manager.registry.ensure_loaded()
    if "autodiff" not in manager.registry.decorators:
        pytest.skip("ember-autodiff is not installed")


def _rand(dev: Device) -> list[float]:
    return ember.rand(4, device=dev).tolist()


# -- manual_seed ------------------------------------------------------------------------------------------------

def test_manual_seed_repeats_the_default_device_stream() -> None:
    ember.manual_seed(0)
    a, b = ember.rand(5).tolist(), ember.randn(3).tolist()
    ember.manual_seed(0)
    assert ember.rand(5).tolist() == a and ember.randn(3).tolist() == b
    ember.manual_seed(1)
    assert ember.rand(5).tolist() != a


def test_manual_seed_seeds_every_device_in_use(autodiff: None) -> None:
    flex, tracked = Device.flex(), Device.flex().autodiff()
    _rand(flex), _rand(tracked)  # both in use before seeding
    ember.manual_seed(7)
    a = _rand(flex)
    ember.manual_seed(7)
    assert _rand(tracked) == a  # one stream per device, shared by its decorations, seeded by the global call


def test_a_device_first_used_after_manual_seed_starts_from_the_seed(plugins: manager.PluginRegistry,
                                                                    autodiff: None) -> None:
    # the fixture empties every device's resolved stack and the backend cache: nothing is in use
    assert all(d._stack is None for d in device_mod._interned.values())
    ember.manual_seed(3)
    first = _rand(Device.flex())  # resolved now, after the call
    ember.manual_seed(3)  # flex is in use now: seeded at once
    assert _rand(Device.flex()) == first


def test_a_decoration_resolved_later_continues_the_stream(plugins: manager.PluginRegistry, autodiff: None) -> None:
    ember.manual_seed(11)
    a1 = _rand(Device.flex())
    a2 = _rand(Device.flex().autodiff())  # first use of this decoration: the shared stream is not restarted
    ember.manual_seed(11)
    b1, b2 = _rand(Device.flex()), _rand(Device.flex())
    assert (a1, a2) == (b1, b2) and a1 != a2


def test_manual_seed_of_one_device_leaves_the_global_seed() -> None:
    ember.manual_seed(5)
    ember.manual_seed(9, device="flex")
    assert ember.initial_seed() == 5
    x = _rand(Device.flex())
    ember.manual_seed(9, Device.flex())
    assert _rand(Device.flex()) == x


def test_initial_seed_seed_and_draw_seed() -> None:
    ember.manual_seed(0)
    assert ember.initial_seed() == 0
    oracle = np.random.Generator(np.random.PCG64(0)).integers(0, 2**63, size=3).tolist()
    assert [ember.draw_seed() for _ in range(3)] == oracle
    ember.manual_seed(-1)  # negative seeds wrap modulo 2**64, as in torch
    assert ember.initial_seed() == 2**64 - 1
    s = ember.seed()
    assert 0 <= s < 2**63 and ember.initial_seed() == s
    first = ember.draw_seed()
    ember.manual_seed(s)
    assert ember.draw_seed() == first


def test_initial_seed_without_manual_seed_is_drawn_once() -> None:
    device_mod._initial_seed = device_mod._host_rng = None
    s = ember.initial_seed()
    assert 0 <= s < 2**63 and ember.initial_seed() == s
    drawn = ember.draw_seed()
    ember.manual_seed(s)  # the unseeded run's host draws can be repeated from the logged seed
    assert ember.draw_seed() == drawn


@pytest.mark.parametrize("bad", ["1", 1.5, True, None, 2**64, -(2**63) - 1], ids=repr)
def test_bad_seeds_are_refused(bad: object) -> None:
    with pytest.raises(DeviceError, match="manual_seed: seed"):
        ember.manual_seed(bad)  # type: ignore[arg-type]
    with pytest.raises(DeviceError, match="manual_seed: seed"):
        ember.manual_seed(bad, device="flex")  # type: ignore[arg-type]


# -- the DataLoader's default shuffle seed ----------------------------------------------------------------------

def _epochs(loader: object, n: int) -> list[list[int]]:
    return [[int(v) for _, y in loader for v in y.tolist()] for _ in range(n)]  # type: ignore[attr-defined]


def _loader(**kw: object) -> object:
    from ember_train.data import DataLoader, TensorDataset

    ds = TensorDataset(np.zeros((10, 1), np.float32), np.arange(10))
    return DataLoader(ds, batch_size=3, shuffle=True, device="flex", **kw)


def test_dataloader_shuffles_reproducibly_after_manual_seed() -> None:
    ember.manual_seed(0)
    first = _epochs(_loader(), 2)
    ember.manual_seed(0)
    again = _epochs(_loader(), 2)
    assert first == again
    assert first[0] != first[1]  # successive epochs differ
    assert sorted(first[0]) == list(range(10))
    ember.manual_seed(1)
    assert _epochs(_loader(), 2) != first


def test_dataloader_seed_is_the_global_draw() -> None:
    loader = _loader()
    ember.manual_seed(0)  # after construction: the seed is drawn on first use, so this call still decides it
    assert "drawn on first use" in repr(loader)  # repr does not draw it
    seed = np.random.Generator(np.random.PCG64(0)).integers(0, 2**63)
    assert loader.seed == seed  # type: ignore[attr-defined]
    assert loader.order(1).tolist() == np.random.default_rng(seed + 1).permutation(10).tolist()  # type: ignore
    assert _loader().seed != seed  # type: ignore[attr-defined]  # the next loader takes the next draw


def test_explicit_seed_ignores_the_global_state_and_resume_is_exact() -> None:
    ember.manual_seed(0)
    a = _epochs(_loader(seed=4), 1)
    ember.manual_seed(1)
    assert _epochs(_loader(seed=4), 1) == a
    src = _loader()
    it = iter(src)  # type: ignore[call-overload]
    next(it)
    state = src.state_dict()  # type: ignore[attr-defined]
    rest = [int(v) for _, y in it for v in y.tolist()]
    ember.manual_seed(2)
    dst = _loader()
    dst.load_state_dict(state)  # type: ignore[attr-defined]
    assert [int(v) for _, y in dst for v in y.tolist()] == rest  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"], ids=repr)
def test_dataloader_refuses_bad_seeds(bad: object) -> None:
    with pytest.raises(ValueRangeError, match="DataLoader: seed"):
        _loader(seed=bad)


# -- ember.utils.data -------------------------------------------------------------------------------------------

def test_ember_utils_data_is_ember_train_data() -> None:
    import ember_train.data as train_data
    from ember.utils.data import DataLoader, Dataset, TensorDataset, random_split

    assert (DataLoader, Dataset, TensorDataset, random_split) == (
        train_data.DataLoader, train_data.Dataset, train_data.TensorDataset, train_data.random_split)
    assert ember.utils.data.Subset is train_data.Subset
    assert set(train_data.__all__) <= set(dir(ember.utils.data))
    with pytest.raises(AttributeError, match="has no attribute 'Sampler'.*DataLoader"):
        ember.utils.data.Sampler  # noqa: B018


def test_ember_utils_data_without_ember_train(monkeypatch: pytest.MonkeyPatch) -> None:
    import ember.utils.data as utils_data

    monkeypatch.delitem(vars(utils_data), "DataLoader", raising=False)  # not cached from an earlier import
    monkeypatch.setitem(sys.modules, "ember_train.data", None)  # as if the package were not installed
    with pytest.raises(PluginError, match=r"pip install ember-train"):
        from ember.utils.data import DataLoader  # noqa: F401


# -- ember.device(...) ------------------------------------------------------------------------------------------

def test_ember_device_is_callable_and_still_the_module(autodiff: None) -> None:
    assert ember.device("cpu") is Device.host()
    assert ember.device("flex") is Device.flex()
    assert ember.device("flex", 0) is Device.flex() and ember.device(type="flex", index=0) is Device.flex()
    assert ember.device("flex+autodiff") is Device.flex().autodiff()
    assert ember.device(Device.flex()) is Device.flex()
    assert isinstance(ember.device("cpu"), ember.device) and not isinstance("cpu", ember.device)
    assert device_mod.Device is Device and ember.device.default_device is device_mod.default_device


@pytest.mark.parametrize(("args", "match"), [
    ((0,), "expected a device string or a Device, got int"),
    (("flex:0", 1), "index either in the string or as the argument"),
    (("flex+autodiff", 0), "index either in the string or as the argument"),
    (("flex", -1), "index must be a non-negative int"),
    ((Device.flex, 0), "expected a device string"),
], ids=["int", "index-twice", "decorated-index", "negative-index", "not-a-device"])
def test_ember_device_refuses_bad_arguments(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(DeviceError, match=match):
        ember.device(*args)


def test_ember_device_with_an_index_and_a_device() -> None:
    with pytest.raises(DeviceError, match="an index goes with a kind string"):
        ember.device(Device.flex(), 0)


def _extras() -> set[str]:
    out: set[str] = set()
    for dist in ("ember", "ember-core"):
        try:
            out |= set(metadata.metadata(dist).get_all("Provides-Extra") or [])
        except metadata.PackageNotFoundError:
            pass
    return out


@pytest.mark.parametrize("spec", ["cuda:0", "cuda", "mps"])
def test_a_missing_kind_names_no_extra_that_does_not_exist(spec: str) -> None:
    kind = spec.partition(":")[0]
    manager.registry.ensure_loaded()
    if kind in manager.registry.backends:
        pytest.skip(f"a {kind} backend is installed")
    with pytest.raises(PluginError, match=f"no backend named '{kind}'") as info:
        ember.device(spec)
    msg = str(info.value)
    if kind in _extras():
        assert f"[{kind}]'" in msg
    else:
        assert f"[{kind}]" not in msg and "no plugin provides this device" in msg
    x = ember.ones(2, device="flex")
    with pytest.raises(PluginError, match="no plugin provides this device" if kind not in _extras() else kind):
        x.to(spec)


def test_to_cpu_and_cpu_reach_the_host_device(autodiff: None) -> None:
    host = Device.host()
    for dev in (Device.flex(), Device.flex().autodiff()):
        x = ember.tensor([1.0, 2.0, 3.0], device=dev)
        for y in (x.to("cpu"), x.cpu(), x.to(ember.device("cpu"))):
            assert y.device is host and y.tolist() == [1.0, 2.0, 3.0]
    y = ember.tensor([1.0, 2.0]).to("cpu+autodiff")
    assert y.device is host.autodiff()
    assert "cpu" not in manager.registry.backends or ember.device("cpu").kind == "cpu"
