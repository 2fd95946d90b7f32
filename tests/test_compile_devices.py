"""ember.compile on every backend: the replay calls the device's own kernels (flex bit for bit; OpenCL within the
kit's tolerance), with and without fusion in the device's stack."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import nn

# flex and OpenCL on a CPU driver fuse only when fusion is named; OpenCL on a GPU fuses unnamed too
DEVICES = ["flex+autodiff", "flex+fusion+autodiff", "opencl+autodiff", "opencl+fusion+autodiff"]


def _device(name: str) -> ember.Device:
    try:
        dev = ember.Device.parse(name)
        dev.stack  # noqa: B018 - resolving the stack finds out whether the backend is usable here
        return dev
    except ember.errors.EmberError as e:
        pytest.skip(f"device {name} is not available here: {e}")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        h = nn.functional.max_pool2d(nn.functional.gelu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(h.flatten(1)))


def _run(dev: ember.Device, compiled: bool) -> tuple[list[float], list[np.ndarray], dict | None]:
    ember.manual_seed(0)  # every device: the model is initialised on the default device, then moved
    model = _Net().to(dev)
    model.train()
    opt = ember.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = ember.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    dev.seed(5)
    losses = []
    for _ in range(5):
        x = ember.tensor(rng.standard_normal((6, 1, 8, 8)).astype(np.float32), device=dev)
        y = ember.tensor(rng.integers(0, 3, 6), device=dev)
        losses.append(float(fn(x, y).item()))
    state = [t.numpy().copy() for t in (*model.parameters(), *model.buffers())]
    return losses, state, fn.stats() if compiled else None


@pytest.mark.parametrize("name", DEVICES)
def test_replayed_training_steps_match_eager(name: str) -> None:
    dev = _device(name)
    la, sa, _ = _run(dev, False)
    lb, sb, stats = _run(dev, True)
    assert stats["replays"] == 3 and stats["graph_breaks"] == 0
    if name.startswith("flex"):
        assert la == lb
        for u, v in zip(sa, sb):
            np.testing.assert_array_equal(u, v)
    else:
        np.testing.assert_allclose(lb, la, rtol=1e-4, atol=1e-5)
        for u, v in zip(sa, sb):
            np.testing.assert_allclose(v, u, rtol=1e-3, atol=1e-4)
