"""Core's recurrent-layer ops (ember.ops.recurrent) through their compositions, and nn.utils.rnn (packed
sequences), against torch.

The "toy" backend has no kernel for the ops, so on toy+autodiff the layer op's composition runs and is
differentiated op by op, and on plain toy ``rnn_layer_backward`` runs its own composition (backpropagation through
time in ember ops): both are compared with torch's modules and autograd here. (The flex kernels are tested in
ember-flex's tests/test_rnn_kernels.py.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember import Device
from ember.errors import DeviceError, DTypeError, ShapeError, ValueRangeError
from ember.nn.utils import rnn as U
from ember.ops import recurrent as R

torch = pytest.importorskip("torch")
TU = torch.nn.utils.rnn

TOL = {"rtol": 1e-9, "atol": 1e-11}
KINDS = ["LSTM", "LSTM_proj", "GRU", "RNN", "RNN_relu"]


def _torch_module(kind: str, *args: Any, **kw: Any) -> Any:
    if kind == "LSTM_proj":
        return torch.nn.LSTM(*args, proj_size=2, dtype=torch.float64, **kw)
    if kind == "RNN_relu":
        return torch.nn.RNN(*args, nonlinearity="relu", dtype=torch.float64, **kw)
    return getattr(torch.nn, kind)(*args, dtype=torch.float64, **kw)


def _ember_module(kind: str, tm: Any, dev: Device, *args: Any, **kw: Any) -> Any:
    extra = {"LSTM_proj": {"proj_size": 2}, "RNN_relu": {"nonlinearity": "relu"}}.get(kind, {})
    em = getattr(ember.nn, kind.split("_")[0])(*args, dtype=ember.float64, device=dev, **extra, **kw)
    em.load_state_dict({k: ember.tensor(v.detach().numpy(), device=dev) for k, v in tm.state_dict().items()})
    return em


def _pair(a: np.ndarray, dev: Device) -> tuple[Any, Any]:
    return ember.tensor(a, device=dev, requires_grad=True), torch.tensor(a, requires_grad=True)


# -- modules on a backend without kernels: the composition, differentiated ------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kw", [{}, {"num_layers": 2, "bidirectional": True, "batch_first": True}],
                         ids=["plain", "layers2-bidir-bf"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_modules_on_toy_vs_torch(kind: str, kw: dict[str, Any], packed: bool) -> None:
    dev = Device.parse("toy+autodiff")
    tm = _torch_module(kind, 3, 4, **kw)
    em = _ember_module(kind, tm, dev, 3, 4, **kw)
    rng = np.random.default_rng(0)
    bf = kw.get("batch_first", False)
    ex, tx = _pair(rng.standard_normal((4, 5, 3) if bf else (5, 4, 3)), dev)
    lengths = [2, 5, 1, 4]
    n_states = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    size = 2 if kind == "LSTM_proj" else 4
    eh, th = _pair(rng.standard_normal((n_states, 4, size)), dev)
    leaves_e, leaves_t = [ex, eh], [tx, th]
    if kind.startswith("LSTM"):
        ec, tc = _pair(rng.standard_normal((n_states, 4, 4)), dev)
        leaves_e.append(ec)
        leaves_t.append(tc)
        e_hx, t_hx = (eh, ec), (th, tc)
    else:
        e_hx, t_hx = eh, th
    e_in = U.pack_padded_sequence(ex, lengths, bf, enforce_sorted=False) if packed else ex
    t_in = TU.pack_padded_sequence(tx, lengths, bf, enforce_sorted=False) if packed else tx
    e_out, e_h = em(e_in, e_hx)
    t_out, t_h = tm(t_in, t_hx)
    if packed:
        e_out, e_len = U.pad_packed_sequence(e_out, bf)
        t_out, t_len = TU.pad_packed_sequence(t_out, bf)
        assert e_len.numpy().tolist() == t_len.tolist()
    e_all = [e_out, *(e_h if isinstance(e_h, tuple) else (e_h,))]
    t_all = [t_out, *(t_h if isinstance(t_h, tuple) else (t_h,))]
    e_loss = t_loss = 0
    for eo, to in zip(e_all, t_all, strict=True):
        np.testing.assert_allclose(eo.numpy(), to.detach().numpy(), **TOL)
        w = rng.standard_normal(tuple(to.shape))
        e_loss = e_loss + (eo * ember.tensor(w, device=dev)).sum()
        t_loss = t_loss + (to * torch.tensor(w)).sum()
    e_loss.backward()
    t_loss.backward()
    for i, (el, tl) in enumerate(zip(leaves_e, leaves_t, strict=True)):
        np.testing.assert_allclose(el.grad.numpy(), tl.grad.numpy(), **TOL, err_msg=f"leaf {i}")
    ep = dict(em.named_parameters())
    for name, p in tm.named_parameters():
        np.testing.assert_allclose(ep[name].grad.numpy(), p.grad.numpy(), **TOL, err_msg=name)


# -- the backward op's composition against torch's autograd ---------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("lengths", [None, [5, 4, 4, 2]], ids=["dense", "packed"])
def test_backward_composition_vs_torch(kind: str, reverse: bool, lengths: Any) -> None:
    """One layer direction: rnn_layer then rnn_layer_backward on toy (both compositions) against a bidirectional
    torch layer whose other direction gets no upstream gradient."""
    dev = Device.parse("toy")
    tm = _torch_module(kind, 3, 4, bidirectional=True)
    mode = {"LSTM_proj": "LSTM", "RNN": "RNN_TANH", "RNN_relu": "RNN_RELU"}.get(kind, kind)
    lstm, proj = mode == "LSTM", kind == "LSTM_proj"
    size = 2 if proj else 4
    d = 1 if reverse else 0
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4, 3))
    h0 = rng.standard_normal((2, 4, size))
    c0 = rng.standard_normal((2, 4, 4))
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
    t_in = TU.pack_padded_sequence(tx, lengths) if lengths else tx
    t_out, t_h = tm(t_in, (th, tc) if lstm else th)
    if lengths:
        t_out = TU.pad_packed_sequence(t_out)[0]
    dy = rng.standard_normal((5, 4, size))
    dhn = rng.standard_normal((4, size))
    dcn = rng.standard_normal((4, 4))
    t_hn, t_cn = (t_h if lstm else (t_h, None))
    loss = (t_out[..., d * size:(d + 1) * size] * torch.tensor(dy)).sum() + (t_hn[d] * torch.tensor(dhn)).sum()
    if lstm:
        loss = loss + (t_cn[d] * torch.tensor(dcn)).sum()
    loss.backward()

    sfx = "_l0_reverse" if reverse else "_l0"
    p = {k: ember.tensor(v.detach().numpy(), device=dev) for k, v in tm.named_parameters()}

    def e(a: np.ndarray) -> Any:
        return ember.tensor(a, device=dev)

    batch_sizes = None
    if lengths:
        batch_sizes = tuple(int(n) for n in (np.asarray(lengths)[None, :] > np.arange(5)[:, None]).sum(1))
    kw = {"mode": mode, "reverse": reverse, "batch_sizes": batch_sizes}
    w_hr = p[f"weight_hr{sfx}"] if proj else None
    args = (e(x), e(h0[d]), e(c0[d]) if lstm else None, p[f"weight_ih{sfx}"], p[f"weight_hh{sfx}"],
            p[f"bias_ih{sfx}"], p[f"bias_hh{sfx}"], w_hr)
    out = R.rnn_layer(*args, **kw)
    if lengths:  # padded positions hold zeros, as torch's pad_packed_sequence gives
        np.testing.assert_allclose(out[0].numpy(), t_out[..., d * size:(d + 1) * size].detach().numpy(), **TOL)
    grads = R.rnn_layer_backward(args[0], args[1], args[2], args[3], args[4], w_hr, out[0], out[-1], e(dy), e(dhn),
                                 e(dcn) if lstm else None, **kw)
    want = [tx.grad.numpy(), th.grad.numpy()[d], tm.get_parameter(f"weight_ih{sfx}").grad.numpy(),
            tm.get_parameter(f"weight_hh{sfx}").grad.numpy(), tm.get_parameter(f"bias_ih{sfx}").grad.numpy(),
            tm.get_parameter(f"bias_hh{sfx}").grad.numpy()]
    if lstm:
        want.append(tc.grad.numpy()[d])
    if proj:
        want.append(tm.get_parameter(f"weight_hr{sfx}").grad.numpy())
    assert len(grads) == len(want)
    for i, (g, w) in enumerate(zip(grads, want, strict=True)):
        np.testing.assert_allclose(g.numpy(), w, **TOL, err_msg=f"gradient {i}")


# -- nn.utils.rnn ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_and_pad_round_trip_vs_torch(batch_first: bool, enforce_sorted: bool) -> None:
    dev = Device.parse("flex+autodiff")
    rng = np.random.default_rng(2)
    lengths = [5, 3, 3, 1] if enforce_sorted else [3, 5, 1, 3]
    a = rng.standard_normal((4, 5, 2) if batch_first else (5, 4, 2))
    ex, tx = _pair(a, dev)
    ep = U.pack_padded_sequence(ex, ember.tensor(lengths), batch_first, enforce_sorted)
    tp = TU.pack_padded_sequence(tx, torch.tensor(lengths), batch_first, enforce_sorted)
    np.testing.assert_array_equal(ep.data.numpy(), tp.data.detach().numpy())
    assert ep.batch_sizes.numpy().tolist() == tp.batch_sizes.tolist() and ep.batch_sizes.dtype is ember.int64
    for mine, theirs in ((ep.sorted_indices, tp.sorted_indices), (ep.unsorted_indices, tp.unsorted_indices)):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert mine.numpy().tolist() == theirs.tolist()
    e_pad, e_len = U.pad_packed_sequence(ep, batch_first, padding_value=-1.5, total_length=7)
    t_pad, t_len = TU.pad_packed_sequence(tp, batch_first, padding_value=-1.5, total_length=7)
    np.testing.assert_array_equal(e_pad.numpy(), t_pad.detach().numpy())
    assert e_len.numpy().tolist() == t_len.tolist()
    w = rng.standard_normal(tuple(t_pad.shape))
    (e_pad * ember.tensor(w, device=dev)).sum().backward()
    (t_pad * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(ex.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_vs_torch(batch_first: bool, padding_side: str) -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((n, 2, 3)) for n in (2, 4, 1)]
    got = U.pad_sequence([ember.tensor(a) for a in arrays], batch_first, 0.5, padding_side)
    want = TU.pad_sequence([torch.tensor(a) for a in arrays], batch_first, 0.5, padding_side)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_pack_sequence_unpack_unpad() -> None:
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal((n, 3)) for n in (2, 4, 1)]
    ep = U.pack_sequence([ember.tensor(a) for a in arrays], enforce_sorted=False)
    tp = TU.pack_sequence([torch.tensor(a) for a in arrays], enforce_sorted=False)
    np.testing.assert_array_equal(ep.data.numpy(), tp.data.numpy())
    for mine, a in zip(U.unpack_sequence(ep), arrays, strict=True):
        np.testing.assert_array_equal(mine.numpy(), a)
    padded = U.pad_sequence([ember.tensor(a) for a in arrays])
    for mine, a in zip(U.unpad_sequence(padded, [2, 4, 1]), arrays, strict=True):
        np.testing.assert_array_equal(mine.numpy(), a)
    assert ep.to(ember.float32).data.dtype is ember.float32 and ep.cpu() is ep


def test_errors_as_torch() -> None:
    x = ember.zeros(4, 3, 2)
    with pytest.raises(ValueRangeError, match="sorted in decreasing order"):
        U.pack_padded_sequence(x, [1, 4, 2])
    with pytest.raises(ValueRangeError, match="greater than 0"):
        U.pack_padded_sequence(x, [4, 0, 0], enforce_sorted=False)
    with pytest.raises(ShapeError, match="expected 3 lengths"):
        U.pack_padded_sequence(x, [4, 2])
    with pytest.raises(ValueRangeError, match="exceeds"):
        U.pack_padded_sequence(x, [5, 2, 1])
    with pytest.raises(DeviceError, match="1D CPU int64 tensor"):
        U.pack_padded_sequence(x, ember.tensor([4, 2, 1], device="toy"))
    with pytest.raises(DTypeError, match="ints"):
        U.pack_padded_sequence(x, [4.0, 2.0, 1.0])
    p = U.pack_padded_sequence(x, [4, 2, 1])
    with pytest.raises(ValueRangeError, match="total_length"):
        U.pad_packed_sequence(p, total_length=3)
    with pytest.raises(ValueRangeError, match="padding_side"):
        U.pad_sequence([x[0]], padding_side="middle")
    with pytest.raises(DTypeError, match="PackedSequence"):
        U.pad_packed_sequence(x)  # type: ignore[arg-type]
    m = ember.nn.GRU(5, 3)
    with pytest.raises(ShapeError, match="packed input data"):
        m(p)  # data has 2 features, the GRU expects 5
    with pytest.raises(ValueRangeError, match="non-increasing"):
        R.rnn_layer(ember.zeros(2, 2, 1), ember.zeros(2, 1), None, ember.zeros(1, 1), ember.zeros(1, 1), None, None,
                    None, mode="RNN_TANH", batch_sizes=(1, 2))


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
@pytest.mark.parametrize("batched", [True, False])
def test_cells_on_toy_vs_torch(kind: str, batched: bool) -> None:
    dev = Device.parse("toy+autodiff")
    tm = getattr(torch.nn, kind)(3, 4, dtype=torch.float64)
    em = getattr(ember.nn, kind)(3, 4, dtype=ember.float64, device=dev)
    em.load_state_dict({k: ember.tensor(v.detach().numpy(), device=dev) for k, v in tm.state_dict().items()})
    rng = np.random.default_rng(5)
    lead = (2,) if batched else ()
    ex, tx = _pair(rng.standard_normal((*lead, 3)), dev)
    eh, th = _pair(rng.standard_normal((*lead, 4)), dev)
    ec, tc = _pair(rng.standard_normal((*lead, 4)), dev)
    e_out = em(ex, (eh, ec)) if kind == "LSTMCell" else (em(ex, eh),)
    t_out = tm(tx, (th, tc)) if kind == "LSTMCell" else (tm(tx, th),)
    e_loss = t_loss = 0
    for eo, to in zip(e_out, t_out, strict=True):
        np.testing.assert_allclose(eo.numpy(), to.detach().numpy(), **TOL)
        w = rng.standard_normal(tuple(to.shape))
        e_loss = e_loss + (eo * ember.tensor(w, device=dev)).sum()
        t_loss = t_loss + (to * torch.tensor(w)).sum()
    e_loss.backward()
    t_loss.backward()
    leaves = [(ex, tx), (eh, th)] + ([(ec, tc)] if kind == "LSTMCell" else [])
    for el, tl in leaves:
        np.testing.assert_allclose(el.grad.numpy(), tl.grad.numpy(), **TOL)
    ep = dict(em.named_parameters())
    for name, p in tm.named_parameters():
        np.testing.assert_allclose(ep[name].grad.numpy(), p.grad.numpy(), **TOL, err_msg=name)
