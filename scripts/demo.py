"""ember's main job until training lands: fit a small MLP classifier on the default device.

A two-layer perceptron (2 -> 64 -> 2, ReLU, softmax cross-entropy) learns the "two moons" data set, generated here
with numpy from a fixed seed. The forward pass and the hand-derived backward pass both run as ember ops on
``Device.default()`` (there is no autodiff yet); numpy only generates and shuffles the data. Prints the loss per
epoch, the test accuracy and the time taken; exits with status 1 when the accuracy is below 90%.

    ./scripts/demo.sh                      # set up, then run this on the default device
    EMBER_DEVICE=toy .venv/bin/python scripts/demo.py
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

import numpy as np

import ember
from ember import Device, Tensor

MIN_ACCURACY = 0.90


def two_moons(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved half circles (sklearn's make_moons), standardised; labels 0 and 1."""
    half = n // 2
    t_out = rng.uniform(0.0, math.pi, half)
    t_in = rng.uniform(0.0, math.pi, n - half)
    outer = np.stack([np.cos(t_out), np.sin(t_out)], axis=1)
    inner = np.stack([1.0 - np.cos(t_in), 0.5 - np.sin(t_in)], axis=1)
    x = np.concatenate([outer, inner]) + rng.normal(0.0, noise, (n, 2))
    y = np.concatenate([np.zeros(half, np.int64), np.ones(n - half, np.int64)])
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x.astype(np.float32), y


def log_softmax(z: Tensor) -> Tensor:
    """Row-wise log-softmax (ember.nn.functional's when present)."""
    functional = getattr(getattr(ember, "nn", None), "functional", None)
    if functional is not None and hasattr(functional, "log_softmax"):
        return functional.log_softmax(z, dim=1)
    return z - z.logsumexp(dim=1, keepdim=True)


class MLP:
    """2 -> hidden -> classes with ReLU; parameters and momentum buffers live on the device."""

    def __init__(self, n_in: int, hidden: int, n_out: int, device: Device) -> None:
        # He initialisation for the ReLU layer, Glorot-ish for the output layer
        self.w1 = ember.randn(n_in, hidden, device=device) * math.sqrt(2.0 / n_in)
        self.b1 = ember.zeros(hidden, device=device)
        self.w2 = ember.randn(hidden, n_out, device=device) * math.sqrt(1.0 / hidden)
        self.b2 = ember.zeros(n_out, device=device)
        self.params = [self.w1, self.b1, self.w2, self.b2]
        self.velocity = [ember.zeros_like(p) for p in self.params]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = x @ self.w1 + self.b1
        a = h.clamp_min(0.0)
        return h, a, a @ self.w2 + self.b2

    def step(self, x: Tensor, onehot: Tensor, lr: float, momentum: float) -> float:
        """One SGD-with-momentum step on a batch; returns the batch's mean cross-entropy."""
        n = x.shape[0]
        h, a, logits = self.forward(x)
        logp = log_softmax(logits)
        loss = -(onehot * logp).sum() / n
        # backward, derived by hand: d(loss)/d(logits) = (softmax - onehot) / n
        dlogits = (logp.exp() - onehot) / n
        dh = ember.einsum("bc,hc->bh", dlogits, self.w2) * (h > 0)  # through W2, then ReLU's gate
        # einsum contracts over the batch directly: no transposed copies of x, a or W2
        grads = [ember.einsum("bi,bh->ih", x, dh), dh.sum(dim=0), ember.einsum("bh,bc->hc", a, dlogits),
                 dlogits.sum(dim=0)]
        for p, v, g in zip(self.params, self.velocity, grads):
            v.mul_(momentum).add_(g)
            p.sub_(v * lr)
        return loss.item()

    def accuracy(self, x: Tensor, y: Tensor) -> float:
        _, _, logits = self.forward(x)
        return (logits.argmax(dim=1) == y).float().mean().item()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train a small MLP on two moons with ember")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    info = ember.info()
    backends = ", ".join(f"{b['name']} ({b['kind']}, {b['devices']} device)" for b in info["backends"]) or "none"
    print(f"ember {info['ember']} | contract {info['contract']} | backends: {backends} | "
          f"load errors: {len(info['errors'])}")
    device = Device.default()
    print(f"device: {device!r}")

    rng = np.random.default_rng(args.seed)
    x_all, y_all = two_moons(args.samples, 0.15, rng)
    n_train = int(0.8 * len(x_all))
    x_train, y_train = x_all[:n_train], y_all[:n_train]
    onehot_train = np.eye(2, dtype=np.float32)[y_train]
    x_test = ember.tensor(x_all[n_train:], device=device)
    y_test = ember.tensor(y_all[n_train:], device=device)

    ember.manual_seed(args.seed, device=device)
    model = MLP(2, 64, 2, device)
    print(f"training a 2-64-2 MLP on {n_train} two-moons points ({len(x_all) - n_train} held out), "
          f"batch {args.batch_size}, SGD lr {args.lr} momentum 0.9")

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n_train)  # host-side shuffling: the data loader's job, not the model's
        total = 0.0
        for lo in range(0, n_train, args.batch_size):
            idx = order[lo:lo + args.batch_size]
            xb = ember.tensor(x_train[idx], device=device)
            yb = ember.tensor(onehot_train[idx], device=device)
            total += model.step(xb, yb, args.lr, 0.9) * len(idx)
        print(f"epoch {epoch:3d}  loss {total / n_train:.4f}")
    elapsed = time.perf_counter() - start

    acc = model.accuracy(x_test, y_test)
    print(f"test accuracy {acc:.1%} in {elapsed:.2f} s on {device}")
    if acc < MIN_ACCURACY:
        print(f"FAILED: accuracy {acc:.1%} is below {MIN_ACCURACY:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
