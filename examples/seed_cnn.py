"""The seed CNN (docs/models.md) on the UCI digits with the Learner: dashboard, checkpoints, logs.

    python examples/seed_cnn.py                    # ~8 epochs, >= 97 % validation accuracy
    python examples/seed_cnn.py --quick            # a few batches (CI smoke test)
    python examples/seed_cnn.py --out runs/cnn --resume
"""

from __future__ import annotations

import argparse
import sys
import time

import ember
from ember import nn
from ember_train.data import DataLoader, Subset, TransformDataset
from ember_train.datasets import digits
from ember_train.learner import Learner
from ember_train.models import SeedCNN
from ember_train.transforms import RandomCrop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--device", default=None, help="device spec (default: ember.Device.default())")
    parser.add_argument("--out", default="runs/seed_cnn_example")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh even if --out holds another run (its files move to --out/replaced-*)")
    parser.add_argument("--quick", action="store_true", help="tiny run: 1 epoch on 192 images")
    args = parser.parse_args(argv)

    device = (ember.Device.parse(args.device) if args.device else ember.Device.default()).autodiff()
    train_ds = TransformDataset(digits("train"), RandomCrop(28, padding=2))  # random 2-pixel shifts
    valid_ds = digits("valid")
    if args.quick:
        train_ds, valid_ds = Subset(train_ds, range(192)), Subset(valid_ds, range(96))
        args.epochs = 1
    train = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, seed=0, device=device)
    valid = DataLoader(valid_ds, batch_size=256, device=device)

    ember.manual_seed(0, device)
    model = SeedCNN().to(device)
    optimizer = ember.optim.Adam(model.parameters(), lr=args.lr)
    total = args.epochs * len(train)
    scheduler = (ember.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total, pct_start=0.25)
                 if total >= 10 else None)
    learner = Learner(model, train, valid, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=scheduler,
                      metrics=("loss", "accuracy"), out_dir=args.out, best_metric="valid_accuracy")
    start = time.perf_counter()
    history = learner.fit(args.epochs, resume="latest" if args.resume else None, overwrite=args.overwrite)
    acc = history["valid_accuracy"][-1]
    print(f"final validation accuracy {acc:.2%} in {time.perf_counter() - start:.1f} s on {device}; "
          f"checkpoints in {args.out}")
    return 130 if history.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
