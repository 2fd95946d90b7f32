"""Regression from a CSV file: an MLP fitted with the Learner, reporting validation MSE and R^2.

    python examples/regression_csv.py                          # writes a synthetic CSV to a temp dir first
    python examples/regression_csv.py data.csv --target price  # your own file (header row, numeric columns)
    python examples/regression_csv.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import ember
from ember import nn
from ember_train.data import DataLoader, random_split
from ember_train.datasets import csv_dataset, synthetic_regression
from ember_train.learner import Learner


def write_synthetic_csv(path: str, n: int, features: int) -> None:
    """Columns x0..x{features-1} and target = x @ w + b + noise."""
    ds = synthetic_regression(n, features, noise=0.1, seed=0)
    x = np.stack([ds[i][0] for i in range(n)])
    y = np.stack([ds[i][1] for i in range(n)])
    header = ",".join([f"x{i}" for i in range(features)] + ["target"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="", fmt="%.6g")


def mse_loss(prediction: ember.Tensor, target: ember.Tensor) -> ember.Tensor:
    """MSE of (N, 1) predictions against (N, 1) targets."""
    return nn.functional.mse_loss(prediction, target.reshape(prediction.shape))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", help="CSV file (default: a synthetic one written to a temp dir)")
    parser.add_argument("--target", default="target", help="name of the target column")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--quick", action="store_true", help="tiny run: 256 rows, 2 epochs")
    args = parser.parse_args(argv)

    scratch = tempfile.mkdtemp(prefix="ember-regression-")
    path = args.csv
    if path is None:
        path = os.path.join(scratch, "regression.csv")
        write_synthetic_csv(path, 256 if args.quick else 4000, 8)
        print(f"wrote a synthetic CSV to {path}")
    if args.quick:
        args.epochs = 2
    data = csv_dataset(path, args.target, task="regression")
    train_ds, valid_ds = random_split(data, [0.8, 0.2], seed=0)
    device = ember.Device.default().autodiff()
    train = DataLoader(train_ds, batch_size=64, shuffle=True, seed=0, device=device)
    valid = DataLoader(valid_ds, batch_size=512, device=device)

    ember.manual_seed(0, device)
    features = len(data.feature_names)
    model = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = ember.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = ember.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    learner = Learner(model.to(device), train, valid, loss_fn=mse_loss, optimizer=optimizer, scheduler=scheduler,
                      scheduler_interval="epoch", metrics=("loss",), best_metric="valid_loss", best_mode="min",
                      out_dir=os.path.join(scratch, "run"))
    history = learner.fit(args.epochs)

    # R^2 on the validation split: 1 - SSE / total sum of squares
    model.eval()
    with ember.no_grad():
        pairs = [(model(x).numpy().ravel(), y.numpy().ravel()) for x, y in valid]
    pred = np.concatenate([p for p, _ in pairs])
    true = np.concatenate([t for _, t in pairs])
    r2 = 1.0 - ((pred - true) ** 2).sum() / ((true - true.mean()) ** 2).sum()
    print(f"final validation MSE {history['valid_loss'][-1]:.4f}, R^2 {r2:.4f} ({features} features, "
          f"{len(data)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
