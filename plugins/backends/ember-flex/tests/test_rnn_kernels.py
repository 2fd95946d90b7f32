"""The flex kernels of core's recurrent ops (nn.rnn_layer, nn.rnn_layer_backward) against torch and against the ops'
compositions: LSTM (with and without proj_size), GRU, RNN tanh/relu; float32 and float64; batch_first, initial
states given or not, unbatched, bidirectional, two layers, packed sequences; fused and unfused devices. Every test
that runs a module checks the kernels really ran (a silent fall back to the composition gives the same numbers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device
from ember.nn.utils import rnn as rnn_utils
from ember.ops import recurrent as R

torch = pytest.importorskip("torch")

TOL = {"float32": {"rtol": 2e-4, "atol": 2e-5}, "float64": {"rtol": 1e-9, "atol": 1e-11}}
DEVICES = ["flex+autodiff", "flex+fusion(False)+autodiff"]
KINDS = ["LSTM", "GRU", "RNN", "RNN_relu"]


@pytest.fixture
def calls() -> Iterator[dict[str, int]]:
    """Count the kernels' calls (the originals are restored afterwards)."""
    ember.zeros(1)  # plugins load lazily: the flex kernels are registered once flex is loaded
    counts = {"forward": 0, "backward": 0}
    fwd, bwd = R.rnn_layer.kernels["flex"], R.rnn_layer_backward.kernels["flex"]

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    R.rnn_layer.kernel("flex")(counting("forward", fwd))
    R.rnn_layer_backward.kernel("flex")(counting("backward", bwd))
    try:
        yield counts
    finally:
        R.rnn_layer.kernel("flex")(fwd)
        R.rnn_layer_backward.kernel("flex")(bwd)


def _modules(kind: str, dtype: str, dev: Device, *args: Any, **kw: Any) -> tuple[Any, Any]:
    name, extra = (kind, {}) if kind != "RNN_relu" else ("RNN", {"nonlinearity": "relu"})
    tm = getattr(torch.nn, name)(*args, dtype=getattr(torch, dtype), **extra, **kw)
    em = getattr(ember.nn, name)(*args, dtype=getattr(ember, dtype), device=dev, **extra, **kw)
    em.load_state_dict({k: ember.tensor(v.detach().numpy(), device=dev) for k, v in tm.state_dict().items()})
    return em, tm


def _pair(a: np.ndarray, dev: Device) -> tuple[Any, Any]:
    return ember.tensor(a, device=dev, requires_grad=True), torch.tensor(a, requires_grad=True)


def _flat(out: Any) -> list[Any]:
    """Tensors and packed sequences of a module's output, in order."""
    if isinstance(out, (tuple, list)) and not hasattr(out, "batch_sizes"):
        return [t for o in out for t in _flat(o)]
    return [out]


def _check(em: Any, tm: Any, e_args: list[Any], t_args: list[Any], e_leaves: list[Any], t_leaves: list[Any],
           dtype: str, seed: int = 0) -> None:
    """Forward both, compare every output; backprop one random projection of all outputs and compare the
    gradients of the leaves and of every parameter."""
    tol = TOL[dtype]
    rng = np.random.default_rng(seed)
    e_out, t_out = _flat(em(*e_args)), _flat(tm(*t_args))
    e_out = [rnn_utils.pad_packed_sequence(o)[0] if isinstance(o, rnn_utils.PackedSequence) else o for o in e_out]
    t_out = [torch.nn.utils.rnn.pad_packed_sequence(o)[0] if isinstance(o, torch.nn.utils.rnn.PackedSequence)
             else o for o in t_out]
    e_loss = t_loss = 0
    for eo, to in zip(e_out, t_out, strict=True):
        assert tuple(eo.shape) == tuple(to.shape)
        np.testing.assert_allclose(eo.numpy(), to.detach().numpy(), **tol)
        w = rng.standard_normal(tuple(to.shape)).astype(dtype)
        e_loss = e_loss + (eo * ember.tensor(w, device=eo.device)).sum()
        t_loss = t_loss + (to * torch.tensor(w)).sum()
    e_loss.backward()
    t_loss.backward()
    for i, (el, tl) in enumerate(zip(e_leaves, t_leaves, strict=True)):
        np.testing.assert_allclose(el.grad.numpy(), tl.grad.numpy(), **tol, err_msg=f"leaf {i}")
    ep = dict(em.named_parameters())
    for name, p in tm.named_parameters():
        np.testing.assert_allclose(ep[name].grad.numpy(), p.grad.numpy(), **tol, err_msg=name)


CONFIGS = [
    {},
    {"num_layers": 2},
    {"bidirectional": True},
    {"num_layers": 2, "bidirectional": True, "batch_first": True},
    {"bias": False},
]


@pytest.mark.parametrize("spec", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kw", CONFIGS, ids=["plain", "layers2", "bidir", "layers2-bidir-bf", "nobias"])
@pytest.mark.parametrize("with_hx", [False, True], ids=["zero-state", "hx"])
def test_layers_vs_torch(spec: str, dtype: str, kind: str, kw: dict[str, Any], with_hx: bool,
                         calls: dict[str, int]) -> None:
    dev = Device.parse(spec)
    steps, batch, n_in, hidden = 7, 3, 5, 6
    em, tm = _modules(kind, dtype, dev, n_in, hidden, **kw)
    rng = np.random.default_rng(1)
    shape = (batch, steps, n_in) if kw.get("batch_first") else (steps, batch, n_in)
    ex, tx = _pair(rng.standard_normal(shape).astype(dtype), dev)
    e_args, t_args, e_leaves, t_leaves = [ex], [tx], [ex], [tx]
    if with_hx:
        n_states = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
        eh, th = _pair(rng.standard_normal((n_states, batch, hidden)).astype(dtype), dev)
        e_leaves.append(eh)
        t_leaves.append(th)
        if kind == "LSTM":
            ec, tc = _pair(rng.standard_normal((n_states, batch, hidden)).astype(dtype), dev)
            e_leaves.append(ec)
            t_leaves.append(tc)
            e_args.append((eh, ec))
            t_args.append((th, tc))
        else:
            e_args.append(eh)
            t_args.append(th)
    _check(em, tm, e_args, t_args, e_leaves, t_leaves, dtype)
    directions = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    assert calls == {"forward": directions, "backward": directions}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("with_hx", [False, True], ids=["zero-state", "hx"])
def test_lstm_proj_size(dtype: str, with_hx: bool, calls: dict[str, int]) -> None:
    dev = Device.parse("flex+autodiff")
    em, tm = _modules("LSTM", dtype, dev, 4, 6, num_layers=2, bidirectional=True, proj_size=3)
    rng = np.random.default_rng(2)
    ex, tx = _pair(rng.standard_normal((5, 2, 4)).astype(dtype), dev)
    e_args, t_args, e_leaves, t_leaves = [ex], [tx], [ex], [tx]
    if with_hx:
        eh, th = _pair(rng.standard_normal((4, 2, 3)).astype(dtype), dev)
        ec, tc = _pair(rng.standard_normal((4, 2, 6)).astype(dtype), dev)
        e_args.append((eh, ec))
        t_args.append((th, tc))
        e_leaves += [eh, ec]
        t_leaves += [th, tc]
    _check(em, tm, e_args, t_args, e_leaves, t_leaves, dtype)
    assert calls == {"forward": 4, "backward": 4}


@pytest.mark.parametrize("kind", KINDS)
def test_unbatched(kind: str, calls: dict[str, int]) -> None:
    dev = Device.parse("flex+autodiff")
    em, tm = _modules(kind, "float64", dev, 4, 5, num_layers=2, bidirectional=True)
    ex, tx = _pair(np.random.default_rng(3).standard_normal((6, 4)), dev)
    _check(em, tm, [ex], [tx], [ex], [tx], "float64")
    assert calls["forward"] == 4 and calls["backward"] == 4


@pytest.mark.parametrize("spec", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS + ["LSTM_proj"])
@pytest.mark.parametrize("enforce_sorted", [True, False], ids=["sorted", "unsorted"])
def test_packed_vs_torch(spec: str, dtype: str, kind: str, enforce_sorted: bool, calls: dict[str, int]) -> None:
    dev = Device.parse(spec)
    proj = {"proj_size": 3} if kind == "LSTM_proj" else {}
    kind = kind.replace("_proj", "")
    em, tm = _modules(kind, dtype, dev, 4, 5, num_layers=2, bidirectional=True, **proj)
    lengths = [6, 5, 3, 3, 1] if enforce_sorted else [3, 6, 1, 5, 3]
    rng = np.random.default_rng(4)
    ex, tx = _pair(rng.standard_normal((6, 5, 4)).astype(dtype), dev)
    ep = rnn_utils.pack_padded_sequence(ex, lengths, enforce_sorted=enforce_sorted)
    tp = torch.nn.utils.rnn.pack_padded_sequence(tx, lengths, enforce_sorted=enforce_sorted)
    e_args, t_args, e_leaves, t_leaves = [ep], [tp], [ex], [tx]
    size = 3 if proj else 5
    eh, th = _pair(rng.standard_normal((4, 5, size)).astype(dtype), dev)
    e_leaves.append(eh)
    t_leaves.append(th)
    if kind == "LSTM":
        ec, tc = _pair(rng.standard_normal((4, 5, 5)).astype(dtype), dev)
        e_args.append((eh, ec))
        t_args.append((th, tc))
        e_leaves.append(ec)
        t_leaves.append(tc)
    else:
        e_args.append(eh)
        t_args.append(th)
    _check(em, tm, e_args, t_args, e_leaves, t_leaves, dtype)
    assert calls == {"forward": 4, "backward": 4}


# -- the kernels against the ops' compositions ------------------------------------------------------------------------
def _layer_args(mode: str, dtype: str, proj: bool, bias: bool, seed: int = 5) -> tuple[list[Any], int]:
    steps, batch, n_in, hidden = 6, 4, 3, 5
    size = 2 if proj else hidden
    rows = R.GATES[mode] * hidden
    rng = np.random.default_rng(seed)

    def t(*shape: int) -> Any:
        return ember.tensor(rng.standard_normal(shape).astype(dtype), device="flex")

    args = [t(steps, batch, n_in), t(batch, size), t(batch, hidden) if mode == "LSTM" else None, t(rows, n_in),
            t(rows, size), t(rows) if bias else None, t(rows) if bias else None, t(size, hidden) if proj else None]
    return args, hidden


def _outs(out: Any) -> list[np.ndarray]:
    return [o.numpy() for o in out]


@pytest.mark.parametrize("mode,proj", [("LSTM", False), ("LSTM", True), ("GRU", False), ("RNN_TANH", False),
                                       ("RNN_RELU", False)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("batch_sizes", [None, (4, 4, 3, 2, 2, 1)], ids=["dense", "packed"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_kernels_match_compositions(mode: str, proj: bool, reverse: bool, batch_sizes: Any, dtype: str,
                                    calls: dict[str, int]) -> None:
    args, hidden = _layer_args(mode, dtype, proj, bias=True)
    kw = {"mode": mode, "reverse": reverse, "batch_sizes": batch_sizes}
    tol = TOL.get(dtype, {"rtol": 2e-2, "atol": 2e-2})  # float16: the kernel computes in float32
    got = R.rnn_layer(*args, **kw)
    want = R.rnn_layer.composition(*args, **kw)
    assert calls["forward"] == 1
    assert [o.dtype for o in got] == [o.dtype for o in want] == [getattr(ember, dtype)] * len(want)
    active = None
    if batch_sizes is not None:  # the workspace of inactive rows is unspecified in the composition
        active = np.arange(args[0].shape[1])[None, :] < np.asarray(batch_sizes)[:, None]
    for i, (g, w) in enumerate(zip(_outs(got), _outs(want), strict=True)):
        if i == len(want) - 1 and active is not None:
            g, w = g[active], w[active]
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), **tol, err_msg=f"output {i}")
    x, h0, c0, w_ih, w_hh, _, _, w_hr = args
    y, ws = got[0], got[-1]
    rng = np.random.default_rng(6)

    def g(t: Any) -> Any:
        return ember.tensor(rng.standard_normal(t.shape).astype(dtype), device="flex")

    grads = [x, h0, c0, w_ih, w_hh, w_hr, y, ws, g(y), g(got[1]), g(got[2]) if mode == "LSTM" else None]
    b_got = R.rnn_layer_backward(*grads, **kw)
    b_want = R.rnn_layer_backward.composition(*grads, **kw)
    assert calls["backward"] == 1
    for i, (bg, bw) in enumerate(zip(_outs(b_got), _outs(b_want), strict=True)):
        np.testing.assert_allclose(bg.astype(np.float64), bw.astype(np.float64), **tol, err_msg=f"gradient {i}")


def test_fused_device_keeps_kernel_and_neighbours(calls: dict[str, int]) -> None:
    """On the default (fused) device the layer op is a fusion boundary: ops before and after it still run and the
    result equals the unfused device's."""
    outs = []
    for spec in ("flex", "flex+fusion(False)"):
        dev = Device.parse(spec)
        ember.manual_seed(0)
        m = ember.nn.GRU(3, 4, device=dev)
        x = ember.arange(30, dtype=ember.float32, device=dev).reshape(5, 2, 3) / 30
        y, h = m(x * 2 - 1)
        outs.append(((y + 1) * h.sum()).numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-7)
    assert calls["forward"] == 2 and calls["backward"] == 0  # nothing requires grad: no backward


def test_dropout_between_layers_train_mode() -> None:
    """Training-mode dropout between layers: two calls differ, eval is deterministic, and the second layer's input
    keeps about 1 - p of its values (seen through the gradient of its input projection)."""
    dev = Device.parse("flex+autodiff")
    ember.manual_seed(0)
    m = ember.nn.LSTM(8, 64, num_layers=2, dropout=0.5, device=dev)
    x = ember.randn(20, 16, 8, device=dev)
    m.train()
    a, b = m(x)[0].numpy(), m(x)[0].numpy()
    assert not np.allclose(a, b)
    m.eval()
    np.testing.assert_array_equal(m(x)[0].numpy(), m(x)[0].numpy())
    m.train()
    y, _ = m(x)
    y.sum().backward()
    # d loss / d weight_ih_l1 = sum_t dA_t^T @ dropped(y1_t): a dropped column of y1 contributes nothing, and
    # with p = 0.5 half the layer-1 outputs are zeroed; the gradient itself stays finite and non-trivial
    g = m.weight_ih_l1.grad.numpy()
    assert np.isfinite(g).all() and np.abs(g).sum() > 0


def test_errors() -> None:
    dev = Device.parse("flex")
    args, _ = _layer_args("LSTM", "float32", proj=False, bias=True)
    with pytest.raises(ember.errors.ShapeError, match="rnn_layer"):
        R.rnn_layer(args[0], args[1], None, *args[3:], mode="LSTM")  # LSTM without c0
    with pytest.raises(ember.errors.ValueRangeError, match="non-increasing"):
        R.rnn_layer(*args, mode="LSTM", batch_sizes=(1, 2, 2, 2, 2, 2))
    with pytest.raises(ember.errors.ValueRangeError, match="unknown mode"):
        R.rnn_layer(*args, mode="LSTMX")
    with pytest.raises(ember.errors.DTypeError, match="dtype"):
        R.rnn_layer(args[0].double(), *args[1:], mode="LSTM")
    m = ember.nn.LSTM(3, 4, device=dev)
    with pytest.raises(ember.errors.ShapeError, match="input_size"):
        m(ember.zeros(5, 2, 7, device=dev))


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell", "RNNCell_relu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cells_run_the_layer_kernel(kind: str, dtype: str, calls: dict[str, int]) -> None:
    dev = Device.parse("flex+autodiff")
    name, extra = (kind, {}) if kind != "RNNCell_relu" else ("RNNCell", {"nonlinearity": "relu"})
    tm = getattr(torch.nn, name)(4, 5, dtype=getattr(torch, dtype), **extra)
    em = getattr(ember.nn, name)(4, 5, dtype=getattr(ember, dtype), device=dev, **extra)
    em.load_state_dict({k: ember.tensor(v.detach().numpy(), device=dev) for k, v in tm.state_dict().items()})
    rng = np.random.default_rng(7)
    ex, tx = _pair(rng.standard_normal((3, 4)).astype(dtype), dev)
    eh, th = _pair(rng.standard_normal((3, 5)).astype(dtype), dev)
    if name == "LSTMCell":
        ec, tc = _pair(rng.standard_normal((3, 5)).astype(dtype), dev)
        _check(em, tm, [ex, (eh, ec)], [tx, (th, tc)], [ex, eh, ec], [tx, th, tc], dtype)
    else:
        _check(em, tm, [ex, eh], [tx, th], [ex, eh], [tx, th], dtype)
    assert calls == {"forward": 1, "backward": 1}
