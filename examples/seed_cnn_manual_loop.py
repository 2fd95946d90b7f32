"""The seed CNN on the digits with a hand-written training loop: PyTorch's loop, step for step, in ember.

    python examples/seed_cnn_manual_loop.py [--epochs 8] [--quick]

Saves the trained weights with ``ember.records`` (``--out``, default runs/seed_cnn_manual/model.safetensors);
``examples/inference.py`` loads them back.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ember
from ember import nn
from ember_train.data import DataLoader, Subset
from ember_train.datasets import digits
from ember_train.models import SeedCNN


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    """Accuracy of ``model`` over ``loader`` (eval mode, no gradients recorded)."""
    model.eval()
    correct = seen = 0
    with ember.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(dim=1) == y).sum().item())
            seen += y.shape[0]
    return correct / seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out", default="runs/seed_cnn_manual/model.safetensors")
    parser.add_argument("--quick", action="store_true", help="tiny run: 1 epoch on 192 images")
    args = parser.parse_args(argv)

    device = ember.Device.default().autodiff()  # gradients need the autodiff decorator
    train_ds, valid_ds = digits("train"), digits("valid")
    if args.quick:
        train_ds, valid_ds = Subset(train_ds, range(192)), Subset(valid_ds, range(96))
        args.epochs = 1
    train = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, seed=0, device=device)
    valid = DataLoader(valid_ds, batch_size=256, device=device)

    ember.manual_seed(0, device)
    model = SeedCNN().to(device)
    optimizer = ember.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = ember.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train))
    loss_fn = nn.CrossEntropyLoss()

    start = time.perf_counter()
    acc = 0.0
    for epoch in range(args.epochs):
        model.train()
        train.set_epoch(epoch)  # a fresh, reproducible shuffle per epoch
        total = 0.0
        for x, y in train:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item()
        acc = evaluate(model, valid)
        print(f"epoch {epoch + 1}/{args.epochs}  train_loss {total / len(train):.4f}  valid_accuracy {acc:.2%}",
              flush=True)

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    ember.records.save(model, args.out)
    print(f"final validation accuracy {acc:.2%} in {time.perf_counter() - start:.1f} s; saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
