"""Weight tying and re-assignment: ``state_dict`` keys, ``named_parameters`` (with and without
``remove_duplicate``), ``named_modules`` and ``named_buffers`` list the same names in the same order as PyTorch.

Each pattern is built twice by the same code, once with ``torch.nn`` and once with ``ember.nn``, and the name lists
are compared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device

AD = Device.flex().autodiff()


def _rnn_lm(lib: Any) -> Any:
    """PyTorch's word_language_model: Embedding encoder, LSTM, Linear decoder whose weight is the encoder's."""
    nn = lib.nn

    class RNNModel(nn.Module):
        def __init__(self, ntoken: int = 12, ninp: int = 8, nhid: int = 8, nlayers: int = 2) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.2)
            self.encoder = nn.Embedding(ntoken, ninp)
            self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=0.2)
            self.decoder = nn.Linear(nhid, ntoken)
            self.decoder.weight = self.encoder.weight

    return RNNModel()


def _tied_the_other_way(lib: Any) -> Any:
    nn = lib.nn
    m = nn.Module()
    m.encoder = nn.Embedding(5, 3)
    m.decoder = nn.Linear(3, 5)
    m.encoder.weight = m.decoder.weight  # the encoder's key keeps its (only) place
    return m


def _shared_submodule(lib: Any) -> Any:
    nn = lib.nn
    shared = nn.Linear(3, 3)
    m = nn.Module()
    m.first = shared
    m.middle = nn.BatchNorm1d(3)
    m.second = shared  # one module under two names: both paths in state_dict, one in named_parameters
    return m


def _shared_in_sequential(lib: Any) -> Any:
    nn = lib.nn
    lin = nn.Linear(4, 4)
    return nn.Sequential(lin, nn.ReLU(), lin, nn.Linear(4, 2))


def _reassigned(lib: Any) -> Any:
    """A parameter replaced by a new Parameter, a child by a new child, a buffer re-registered: all keep their
    place; a parameter name re-used for a submodule moves to the submodules."""
    nn = lib.nn
    m = nn.Linear(3, 2)
    m.register_buffer("scale", lib.ones(2))
    m.register_buffer("offset", lib.zeros(2))
    m.head = nn.Linear(2, 2)
    m.tail = nn.Linear(2, 1)
    m.weight = nn.Parameter(lib.zeros(2, 3))
    m.register_parameter("weight", nn.Parameter(lib.ones(2, 3)))
    m.register_buffer("scale", lib.full((2,), 2.0))
    m.head = nn.Linear(2, 2)
    m.bias = None  # None keeps the slot (and state_dict leaves it out)
    return m


def _buffer_becomes_parameter(lib: Any) -> Any:
    nn = lib.nn
    m = nn.Linear(3, 2)
    m.register_buffer("gain", lib.ones(2))
    m.register_buffer("shift", lib.zeros(2))
    m.gain = nn.Parameter(lib.ones(2))  # no longer a buffer: now the last parameter
    return m


def _cross_tied_transformer_like(lib: Any) -> Any:
    """Tying inside nested containers: a ModuleList of blocks sharing one projection, and an output head tied to
    the input embedding."""
    nn = lib.nn
    m = nn.Module()
    m.embed = nn.Embedding(7, 4)
    proj = nn.Linear(4, 4)
    m.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(4), proj) for _ in range(2)])
    m.head = nn.Linear(4, 7, bias=False)
    m.head.weight = m.embed.weight
    return m


PATTERNS: dict[str, Callable[[Any], Any]] = {
    "word_language_model": _rnn_lm,
    "tied_the_other_way": _tied_the_other_way,
    "shared_submodule": _shared_submodule,
    "shared_in_sequential": _shared_in_sequential,
    "reassigned": _reassigned,
    "buffer_becomes_parameter": _buffer_becomes_parameter,
    "nested_tying": _cross_tied_transformer_like,
}


def _names(m: Any) -> dict[str, list[str]]:
    return {
        "state_dict": list(m.state_dict()),
        "state_dict_prefixed": list(m.state_dict(prefix="model.")),
        "named_parameters": [k for k, _ in m.named_parameters()],
        "named_parameters_all": [k for k, _ in m.named_parameters(remove_duplicate=False)],
        "named_modules": [k for k, _ in m.named_modules()],
        "named_modules_all": [k for k, _ in m.named_modules(remove_duplicate=False)],
        "named_buffers": [k for k, _ in m.named_buffers()],
        "named_children": [k for k, _ in m.named_children()],
        "parameters": [str(tuple(p.shape)) for p in m.parameters()],
    }


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_names_and_order_match_torch(pattern: str) -> None:
    build = PATTERNS[pattern]
    assert _names(build(ember)) == _names(build(torch))


def test_word_language_model_keys_spelled_out() -> None:
    keys = list(_rnn_lm(ember).state_dict())
    assert keys[0] == "encoder.weight" and keys[-2:] == ["decoder.weight", "decoder.bias"]
    assert [k for k, _ in _rnn_lm(ember).named_parameters()][-1] == "decoder.bias"  # the tied weight once


def test_tied_weight_is_one_tensor_in_state_dict_and_training() -> None:
    m = _rnn_lm(ember).to(AD)
    sd = m.state_dict(keep_vars=True)
    assert sd["decoder.weight"] is sd["encoder.weight"] is m.encoder.weight
    assert len(list(m.parameters())) == 10  # the tied weight counted once (as torch)
    # a gradient through both uses lands in the one tensor
    emb = m.encoder(ember.tensor(np.array([1, 3]), device=AD))
    m.decoder(emb).sum().backward()
    g = m.encoder.weight.grad.numpy()
    assert g[[1, 3]].any() and g[[0, 2]].any()  # rows from the lookup and from the decoder's matmul
    np.testing.assert_array_equal(m.decoder.weight.grad.numpy(), g)


def test_torch_state_dict_of_a_tied_model_loads_strictly() -> None:
    torch.manual_seed(0)
    tm = _rnn_lm(torch)
    em = _rnn_lm(ember)
    tsd = {k: ember.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()}
    res = em.load_state_dict(tsd)  # strict: the tied key is expected under both names
    assert res.missing_keys == [] and res.unexpected_keys == []
    for k, v in em.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), tm.state_dict()[k].detach().numpy(), err_msg=k)
    assert em.decoder.weight is em.encoder.weight  # loading kept the tie


def test_saved_and_loaded_keys_round_trip_through_ember_save(tmp_path: Any) -> None:
    em = _rnn_lm(ember)
    path = tmp_path / "lm.safetensors"
    ember.save(em.state_dict(), path)
    loaded = ember.load(path)
    assert list(loaded) == list(em.state_dict())
    fresh = _rnn_lm(ember)
    fresh.load_state_dict(loaded)
    np.testing.assert_array_equal(fresh.decoder.weight.numpy(), em.encoder.weight.numpy())
