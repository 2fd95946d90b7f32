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
    x = ember.ones(2)
    with pytest.raises(EmberError, match="'cuda'"):
        x.cuda()
    with pytest.raises(EmberError, match="'cuda'"):
        x.cuda(1)
    with pytest.raises(DeviceError, match=r"cuda: expected a CUDA device, got flex"):
        x.cuda("flex")
