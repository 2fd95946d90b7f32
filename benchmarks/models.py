"""Benchmark models written with ``ember.nn.functional`` (the seed models of docs/models.md), and their PyTorch twins.

There is no ``nn.Module`` yet, so a model is a dict of explicitly created parameter tensors plus a forward
function. Initialisation follows PyTorch's defaults (Conv2d/Linear: weight and bias uniform in
``+-1/sqrt(fan_in)``, which is what ``kaiming_uniform_(a=sqrt(5))`` works out to; BatchNorm: weight 1, bias 0,
running mean 0, running variance 1), drawn from the device's random stream.

``SeedCnn`` is the seed CNN (input 1x28x28, 10 classes)::

    Conv2d 1->64 3x3 -> BatchNorm -> ReLU -> MaxPool 2x2 -> Conv2d 64->64 3x3 -> BatchNorm -> ReLU -> MaxPool 2x2
    -> flatten (1600) -> Linear 1600->128 -> GELU -> Dropout 0.25 -> Linear 128->128 -> GELU -> Dropout 0.25
    -> Linear 128->10; cross-entropy

``Adam`` is a small hand-written Adam (PyTorch's update, no weight decay, no amsgrad) in ember ops under
``ember.no_grad()``, updating parameters in place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

import ember
import ember.nn.functional as F
from ember import Tensor

# name -> shape, in PyTorch's state_dict order (so weights copy across by position)
SEED_CNN_SHAPES: dict[str, tuple[int, ...]] = {
    "conv1.weight": (64, 1, 3, 3),
    "conv1.bias": (64,),
    "bn1.weight": (64,),
    "bn1.bias": (64,),
    "conv2.weight": (64, 64, 3, 3),
    "conv2.bias": (64,),
    "bn2.weight": (64,),
    "bn2.bias": (64,),
    "fc1.weight": (128, 1600),
    "fc1.bias": (128,),
    "fc2.weight": (128, 128),
    "fc2.bias": (128,),
    "fc3.weight": (10, 128),
    "fc3.bias": (10,),
}
SEED_CNN_BUFFERS: dict[str, tuple[int, ...]] = {
    "bn1.running_mean": (64,),
    "bn1.running_var": (64,),
    "bn2.running_mean": (64,),
    "bn2.running_var": (64,),
}
DROPOUT = 0.25


def uniform(shape: tuple[int, ...], bound: float, device: Any, dtype: Any = ember.float32) -> Tensor:
    """Samples uniform in [-bound, bound) from the device's stream (there is no ``uniform_`` yet)."""
    return (ember.rand(*shape, device=device, dtype=dtype) * 2.0 - 1.0) * bound


class SeedCnn:
    """The seed CNN as explicit parameter tensors and a functional forward."""

    def __init__(self, device: Any, dtype: Any = ember.float32, dropout: float = DROPOUT) -> None:
        self.device = device
        self.dropout = dropout
        self.training = True
        self.params: dict[str, Tensor] = {}
        with ember.no_grad():
            for name, shape in SEED_CNN_SHAPES.items():
                if name.startswith("bn"):
                    t = ember.ones(*shape, device=device, dtype=dtype) if name.endswith("weight") else ember.zeros(
                        *shape, device=device, dtype=dtype)
                else:
                    layer = name.split(".")[0]
                    w_shape = SEED_CNN_SHAPES[f"{layer}.weight"]
                    fan_in = math.prod(w_shape[1:])
                    t = uniform(shape, 1.0 / math.sqrt(fan_in), device, dtype)
                self.params[name] = t.requires_grad_()
        self.buffers: dict[str, Tensor] = {
            name: (ember.ones if name.endswith("var") else ember.zeros)(*shape, device=device, dtype=dtype)
            for name, shape in SEED_CNN_BUFFERS.items()
        }

    def parameters(self) -> list[Tensor]:
        return list(self.params.values())

    def load_numpy(self, arrays: dict[str, np.ndarray]) -> None:
        """Overwrite parameters and buffers with copies of ``arrays`` (same names)."""
        with ember.no_grad():
            for name, t in {**self.params, **self.buffers}.items():
                t.copy_(ember.tensor(np.ascontiguousarray(arrays[name]), device=self.device, dtype=t.dtype))

    def state_numpy(self) -> dict[str, np.ndarray]:
        return {name: t.detach().numpy().copy() for name, t in {**self.params, **self.buffers}.items()}

    def __call__(self, x: Tensor) -> Tensor:
        p, b, train = self.params, self.buffers, self.training
        x = F.conv2d(x, p["conv1.weight"], p["conv1.bias"])
        x = F.batch_norm(x, b["bn1.running_mean"], b["bn1.running_var"], p["bn1.weight"], p["bn1.bias"], train)
        x = F.max_pool2d(F.relu(x), 2)
        x = F.conv2d(x, p["conv2.weight"], p["conv2.bias"])
        x = F.batch_norm(x, b["bn2.running_mean"], b["bn2.running_var"], p["bn2.weight"], p["bn2.bias"], train)
        x = F.max_pool2d(F.relu(x), 2)
        x = x.flatten(1)
        x = F.dropout(F.gelu(F.linear(x, p["fc1.weight"], p["fc1.bias"])), self.dropout, train)
        x = F.dropout(F.gelu(F.linear(x, p["fc2.weight"], p["fc2.bias"])), self.dropout, train)
        return F.linear(x, p["fc3.weight"], p["fc3.bias"])


class Adam:
    """PyTorch's Adam (no weight decay, no amsgrad) with in-place updates under ``ember.no_grad()``."""

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        with ember.no_grad():
            self.m = [ember.zeros_like(p) for p in self.params]
            self.v = [ember.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @ember.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        bc1 = 1.0 - b1 ** self.t
        bc2_sqrt = math.sqrt(1.0 - b2 ** self.t)
        step_size = self.lr / bc1
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad
            if g is None:
                continue
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).add_(g * g, alpha=1.0 - b2)
            # same order of operations as torch.optim.Adam (single-tensor path): sqrt(v)/sqrt(bc2) + eps
            denom = (v.sqrt() / bc2_sqrt).add_(self.eps)
            p.sub_(m / denom * step_size)


def train_step(model: SeedCnn, opt: Adam, x: Tensor, y: Tensor) -> Tensor:
    """One training step (forward, cross-entropy, backward, Adam); returns the loss."""
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def seed_cnn_batch(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic batch of MNIST-shaped inputs and labels."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, batch).astype(np.int64)


# ----------------------------------------------------------------------------------------------------------
# the same model in PyTorch (imported lazily: torch is a benchmark-only dependency)
# ----------------------------------------------------------------------------------------------------------
def torch_seed_cnn(dropout: float = DROPOUT) -> Any:
    """The seed CNN as a ``torch.nn.Sequential`` whose state_dict names match :data:`SEED_CNN_SHAPES`."""
    from collections import OrderedDict

    from torch import nn

    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(1, 64, 3)), ("bn1", nn.BatchNorm2d(64)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(64, 64, 3)), ("bn2", nn.BatchNorm2d(64)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(1600, 128)), ("gelu1", nn.GELU()), ("drop1", nn.Dropout(dropout)),
        ("fc2", nn.Linear(128, 128)), ("gelu2", nn.GELU()), ("drop2", nn.Dropout(dropout)),
        ("fc3", nn.Linear(128, 10)),
    ]))


def load_torch(model: Any, arrays: dict[str, np.ndarray]) -> None:
    """Copy ember's parameters and buffers (numpy arrays by name) into the torch twin."""
    import torch

    state = model.state_dict()
    with torch.no_grad():
        for name, a in arrays.items():
            state[name].copy_(torch.from_numpy(np.ascontiguousarray(a)))


def torch_train_step(model: Any, opt: Any, x: Any, y: Any) -> Any:
    import torch.nn.functional as tF

    opt.zero_grad(set_to_none=True)
    loss = tF.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss
