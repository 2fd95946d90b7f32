"""Text classification with the seed pre-norm transformer (docs/models.md, small config) on synthetic data.

Each sequence carries a few class-specific marker tokens among random ones; the model reads its prediction off the
first token, so attention has to gather the markers there.

    python examples/text_transformer.py [--epochs 4] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import ember
from ember import nn
from ember_train.data import DataLoader, random_split
from ember_train.datasets import synthetic_sequences
from ember_train.learner import Learner
from ember_train.models import text_transformer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--quick", action="store_true", help="tiny run: one small layer, 128 short sequences")
    args = parser.parse_args(argv)

    n, seq_len, vocab, classes = (128, 16, 64, 4) if args.quick else (2000, 64, 256, 4)
    data = synthetic_sequences(n, seq_len, vocab, classes, seed=0)
    train_ds, valid_ds = random_split(data, [0.8, 0.2], seed=0)
    device = ember.Device.default().autodiff()
    train = DataLoader(train_ds, batch_size=32, shuffle=True, seed=0, device=device)
    valid = DataLoader(valid_ds, batch_size=128, device=device)

    ember.manual_seed(0, device)
    # the "small" configuration, with the embedding table sized to the synthetic vocabulary
    sizes = {"vocab_size": vocab, "max_len": seq_len}
    if args.quick:
        sizes.update(d_model=32, nhead=4, dim_feedforward=64, num_layers=1)
        args.epochs = 1
    model = text_transformer("small", num_classes=classes, **sizes).to(device)
    print(f"{type(model).__name__}: {model.num_params():,} parameters, {len(model.encoder.layers)} pre-norm layers")
    optimizer = ember.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    learner = Learner(model, train, valid, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer,
                      metrics=("loss", "accuracy"), clip_grad_norm=1.0, out_dir=tempfile.mkdtemp(prefix="ember-tt-"))
    history = learner.fit(args.epochs)
    print(f"final validation accuracy {history['valid_accuracy'][-1]:.2%} ({classes} classes, chance 25%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
