"""ember-router: ops as ember.ir records through channels, graph registration and replay, counters.

Devices are named by string (no other plugin is imported). The oracle is the same program on the device without
the router (bit for bit: the channel runs the same contract calls in the same order), and torch for small ops.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device
from ember.errors import ValueRangeError
from ember_router import CaptureChannel, Channel, Executor, LocalChannel
from ember_train.models import seed_cnn

F = ember.nn.functional


def counters(dev: Device) -> dict[str, int]:
    return {k[len("router_"):]: v for k, v in dev.memory_report().items() if k.startswith("router_")}


def test_device_strings_and_constructor_agree() -> None:
    dev = Device.parse("flex+router(local)")
    assert dev is Device.flex().router("local") is Device.parse("flex+router(channel=local)")
    assert str(dev) == "flex+router(channel=local)"
    assert isinstance(dev.stack.channel, LocalChannel)
    assert "router(local(" in dev.stack.describe()


def test_ops_accumulate_until_a_read_and_match_torch() -> None:
    dev = Device.parse("flex+router(local)")
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x = ember.tensor(a, device=dev)
    before = counters(dev)
    y = (x * 2 + 1).relu().sum(dim=1)
    mid = counters(dev)
    assert mid["replays"] == before["replays"] and mid["pending"] == 4  # nothing sent yet
    out = y.numpy()
    after = counters(dev)
    assert after["replays"] == before["replays"] + 1 and after["ops_sent"] == before["ops_sent"] + 4
    np.testing.assert_allclose(out, (torch.tensor(a) * 2 + 1).relu().sum(dim=1).numpy(), rtol=1e-6)


def test_a_repeated_graph_is_registered_once_and_replayed_with_new_bindings() -> None:
    dev = Device.parse("flex+router(local)")
    x = ember.ones(5, device=dev)
    x.numpy()  # x is on the channel: each step below is the same graph of it
    outs = []
    start = counters(dev)
    for k in (2.0, 3.0, 4.0):
        outs.append((x * k).exp().sum().item())
    end = counters(dev)
    assert end["graphs_registered"] - start["graphs_registered"] == 1  # the scalar is a binding, not the key
    assert end["graph_hits"] - start["graph_hits"] == 2
    np.testing.assert_allclose(outs, [5 * np.exp(2.0), 5 * np.exp(3.0), 5 * np.exp(4.0)], rtol=1e-6)


def _train(spec: str, steps: int) -> tuple[list[float], np.ndarray, list[dict[str, int]]]:
    dev = Device.parse(spec)
    ember.manual_seed(0)
    model = seed_cnn().to(dev)
    opt = ember.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    losses, per_step = [], []
    for _ in range(steps):
        x = ember.tensor(rng.standard_normal((8, 1, 28, 28)).astype(np.float32), device=dev)
        y = ember.tensor(rng.integers(0, 10, 8), device=dev)
        before = counters(dev)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        after = counters(dev)
        per_step.append({k: after[k] - before.get(k, 0) for k in after})
    return losses, model.fc3.weight.detach().numpy(), per_step


def test_seed_cnn_training_through_the_router_equals_training_without_it() -> None:
    losses, w, per_step = _train("flex+autodiff+router(local)", 3)
    ref_losses, ref_w, _ = _train("flex+autodiff", 3)
    assert losses == ref_losses
    np.testing.assert_array_equal(w, ref_w)
    first, last = per_step[0], per_step[-1]
    assert first["graphs_registered"] > 0 and last["graphs_registered"] == 0  # every graph of a step is known
    assert last["replays"] == last["graph_hits"] > 0 and last["ops_sent"] > 50 and last["bytes_sent"] > 0


def test_autodiff_above_the_router_uses_the_devices_conv_kernels_and_its_bits() -> None:
    """flex+router(local)+autodiff: the router offers flex's convolution gradient kernels (recorded like contract
    methods), so the gradients are flex+autodiff's bit for bit (the composition autodiff falls back to without them
    rounds differently); the capture channel, whose graphs replay anywhere, offers none."""
    dev = Device.parse("flex+router(local)")
    assert {"conv_input_grad", "conv_weight_grad"} <= set(dev.stack.channel.kernels())
    assert Device.parse("flex+router(capture)").stack.channel.kernels() == ()
    losses, w, per_step = _train("flex+router(local)+autodiff", 2)
    ref_losses, ref_w, _ = _train("flex+autodiff", 2)
    assert losses == ref_losses
    np.testing.assert_array_equal(w, ref_w)
    assert per_step[-1]["calls"] == 0  # the kernels were recorded into the step's graphs, not called one by one


def test_grad_mode_is_the_one_ops_were_recorded_in() -> None:
    dev = Device.parse("flex+autodiff+router(local)")
    w = ember.ones(3, device=dev).requires_grad_()
    with ember.no_grad():
        u = w * 2  # recorded under no_grad, sent later under grad mode: must stay untracked
    v = w * 3
    assert not u.requires_grad and v.requires_grad
    v.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 3.0, 3.0])


def test_gradient_hooks_see_router_tensors() -> None:
    dev = Device.parse("flex+autodiff+router(local)")
    w = ember.tensor([1.0, 2.0], device=dev).requires_grad_()
    seen: list[Any] = []
    w.register_hook(lambda g: (seen.append(g.device), g * 10)[1])
    (w * w).sum().backward()
    assert seen == [dev]
    np.testing.assert_array_equal(w.grad.numpy(), [20.0, 40.0])


def test_the_size_bound_flushes() -> None:
    dev = Device.flex().router("local", max_pending=4)
    x = ember.ones(2, device=dev)
    start = counters(dev)
    for _ in range(9):
        x = x + 1
    # ones() and 9 adds: 10 records, sent in two graphs of 4 and leaving 2 pending
    assert counters(dev)["replays"] - start["replays"] == 2 and counters(dev)["pending"] == 2
    np.testing.assert_array_equal(x.numpy(), [10.0, 10.0])


def test_dropped_tensors_are_released_on_the_channel() -> None:
    dev = Device.parse("flex+router(local)")
    table = dev.stack.channel.executor.table
    x = ember.ones(4, device=dev)
    x.numpy()
    sizes = []
    for _ in range(8):
        y = x * 2
        y.numpy()
        del y  # the handle dies with the tensor (reference counting)
        dev.sync()
        sizes.append(len(table))
    assert sizes[-1] == sizes[2]  # steady: nothing accumulates


def test_an_extension_op_is_one_record() -> None:
    dev = Device.flex().router("capture")
    q = ember.randn(1, 2, 4, 8, device=dev)
    out = F.scaled_dot_product_attention(q, q, q)
    out.numpy()
    graphs = dev.stack.channel.graphs()
    names = [r.args[0].name for g in graphs for r in g.records if r.op == "extension"]
    assert names == ["nn.scaled_dot_product_attention_out"]  # no autodiff on this device: the output-only op
    qt = torch.tensor(q.numpy())
    np.testing.assert_allclose(out.numpy(), torch.nn.functional.scaled_dot_product_attention(qt, qt, qt).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_the_capture_channel_keeps_graphs_that_replay() -> None:
    dev = Device.flex().router("capture")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = ember.tensor(a, device=dev)
    x.numpy()
    y = ((x - 1) * 0.5).sum(dim=0)
    np.testing.assert_allclose(y.numpy(), ((a - 1) * 0.5).sum(0))
    g = dev.stack.channel.graphs()[-1]
    assert [r.op for r in g.records] == ["binary", "binary", "reduce"]
    assert [v.spec.shape for v in g.inputs] == [(2, 3)]
    (replayed,) = g.replay(ember.tensor(a + 1, device="flex"))
    np.testing.assert_allclose(replayed.numpy(), (a * 0.5).sum(0))
    assert isinstance(dev.stack.channel, CaptureChannel)


class WireChannel(Channel):
    """A third-party channel: every message pickled and unpickled, as over a socket, to an Executor."""

    name = "wire"

    def __init__(self, device: Device) -> None:
        self.executor = Executor(device.stack, device)
        self.kinds: list[str] = []

    def send(self, message: Any) -> Any:
        self.kinds.append(type(message).__name__)
        reply = self.executor.handle(pickle.loads(pickle.dumps(message)))
        return pickle.loads(pickle.dumps(reply))


def test_a_third_party_channel_runs_the_same_program() -> None:
    channel = WireChannel(Device.parse("flex"))
    dev = Device.flex().router(channel)
    a = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    x = ember.tensor(a, device=dev)
    y = F.softmax(x @ x.T, dim=-1)[1:, :2]
    np.testing.assert_allclose(y.numpy(), torch.softmax(torch.tensor(a) @ torch.tensor(a).T, -1)[1:, :2].numpy(),
                               rtol=1e-5, atol=1e-6)
    assert {"Upload", "Register", "Replay", "Download"} <= set(channel.kinds)
    moved = y.to("flex")  # across devices by download and upload (the channel is not local)
    np.testing.assert_array_equal(moved.numpy(), y.numpy())
    # layout checks are the channel device's: asked for with a Strides message, once per handle
    t = ember.arange(24.0, device=dev).reshape(2, 3, 4).transpose(1, 2)
    with pytest.raises(ember.ShapeError, match="not compatible with input tensor's size"):
        t.view(2, 12)
    e = ember.zeros(3, device=dev).expand(2, 3)
    with pytest.raises(ember.UnsupportedError, match="refers to a single memory location"):
        e[0, 0] = 1.0
    asked = channel.kinds.count("Strides")
    assert asked == 2 and e._h.strides == (0, 4) and channel.kinds.count("Strides") == asked


def test_local_channel_on_another_device() -> None:
    target = Device.parse("flex+fusion(False)")
    dev = Device.flex().router("local", device=target)
    assert dev.stack.channel.executor.stack is target.stack
    x = ember.arange(6, device=dev).reshape(2, 3).float()
    np.testing.assert_array_equal((x * x).sum(dim=1).numpy(), [5.0, 50.0])


@pytest.mark.parametrize(("options", "match"), [
    ({"channel": "nowhere"}, "channel must be one of"),
    ({"channel": "local", "bogus": 1}, "unknown option"),
    ({"channel": "local", "max_pending": 0}, "max_pending must be a positive int"),
    ({"channel": "local", "device": 3}, "device must be a Device"),
])
def test_bad_options_are_typed_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueRangeError, match=match):
        Device.flex().router(**options).stack  # noqa: B018 - resolving the stack runs the factory
