"""``ember.Size`` (torch.Size's behaviour) and the ``ember.cuda`` queries ported scripts ask."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import ember
from ember.errors import DeviceError, EmberError


def test_shape_is_a_size_that_behaves_like_torch_size() -> None:
    x = ember.zeros(2, 3, 4)
    t = torch.zeros(2, 3, 4)
    assert isinstance(x.shape, ember.Size) and isinstance(x.size(), ember.Size)
    assert isinstance(x.shape, tuple)
    assert x.shape == (2, 3, 4) == tuple(t.shape)
    assert hash(x.shape) == hash((2, 3, 4))
    for got, want in [(x.shape[1:], t.shape[1:]), (x.shape + (5,), t.shape + (5,)), ((1,) + x.shape, (1,) + t.shape)]:
        assert type(got) is ember.Size and type(want) is torch.Size
        assert tuple(got) == tuple(want)
    assert x.shape[-1] == 4 and type(x.shape[-1]) is int
    assert x.shape.numel() == t.shape.numel() == 24
    assert ember.Size([]).numel() == torch.Size([]).numel() == 1
    assert repr(x.shape) == "ember.Size([2, 3, 4])"
    assert str(x.shape) == "(2, 3, 4)" and f"{x.shape}" == "(2, 3, 4)"  # messages read as the tuple
    assert pickle.loads(pickle.dumps(x.shape)) == x.shape
    assert type(pickle.loads(pickle.dumps(x.shape))) is ember.Size


def test_a_size_is_accepted_wherever_a_shape_is() -> None:
    x = ember.arange(6.0)
    s = ember.Size([2, 3])
    assert ember.zeros(s).shape == (2, 3)
    np.testing.assert_array_equal(x.reshape(s).numpy(), np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(x.view(ember.Size([3, 2])).numpy(), np.arange(6.0).reshape(3, 2))
    assert ember.ones(2, 3).expand(ember.Size([4, 2, 3])).shape == (4, 2, 3)
    assert ember.zeros(*ember.ones(1, 5).shape).shape == (1, 5)


def test_cuda_queries_without_a_cuda_backend() -> None:
    assert ember.cuda.is_available() is False
    assert ember.cuda.device_count() == 0
    ember.cuda.manual_seed(0)  # no CUDA devices: nothing to seed, as in torch
    ember.cuda.manual_seed_all(0)
    for call in (ember.cuda.synchronize, ember.cuda.current_device, ember.cuda.get_device_name):
        with pytest.raises(DeviceError, match=r"ember\.cuda\.\w+: no CUDA device is available.*is_available"):
            call()


def test_the_usual_device_choice_picks_the_host() -> None:
    device = ember.device("cuda" if ember.cuda.is_available() else "cpu")
    assert device == ember.Device.host()


def test_tensor_cuda_without_a_cuda_backend_says_so() -> None:
    """No backend named cuda, or (ember-cuda installed) no CUDA device: either way the error names it."""
    if ember.cuda.is_available():
        pytest.skip("a CUDA device is present")
    x = ember.ones(2)
    with pytest.raises(EmberError, match=r"'cuda'|Device\.cuda\(0\): only 0 cuda device"):
        x.cuda()
    with pytest.raises(EmberError, match=r"'cuda'|Device\.cuda\(1\): only 0 cuda device"):
        x.cuda(1)
    with pytest.raises(DeviceError, match=r"cuda: expected a CUDA device, got flex"):
        x.cuda("flex")


@pytest.mark.parametrize("bad,match", [(["a"], "item 0 is str"), ([2, 1.5], "item 1 is float"), (3, "got int")])
def test_size_refuses_what_torch_size_refuses(bad: object, match: str) -> None:
    with pytest.raises(TypeError):  # torch's verdict on the same input
        torch.Size(bad)  # type: ignore[arg-type]
    with pytest.raises(ember.ShapeError, match=rf"Size: expected an iterable of ints, {match}"):
        ember.Size(bad)  # type: ignore[arg-type]


def test_size_takes_what_torch_size_takes() -> None:
    for ok in ([True, 2], np.array([2, 3]), (np.int64(4),), []):
        assert tuple(ember.Size(ok)) == tuple(torch.Size(ok))
        assert all(type(v) is int for v in ember.Size(ok))


def test_cuda_calls_refuse_other_devices_and_bad_arguments() -> None:
    with pytest.raises(DeviceError, match=r"ember\.cuda\.synchronize: expected a CUDA device, got flex"):
        ember.cuda.synchronize("flex")
    with pytest.raises(EmberError):
        ember.ones(2).cuda(True)  # not an index: a bool is read as a device spec and refused


def test_shapes_and_cuda_queries_from_several_threads() -> None:
    import threading

    x = ember.zeros(3, 4)
    seen: list[object] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(200):
                s = x.shape
                seen.append((type(s), tuple(s), s.numel(), ember.cuda.is_available(), ember.cuda.device_count()))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(seen) == 1200 and set(seen) == {(ember.Size, (3, 4), 12, False, 0)}
