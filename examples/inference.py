"""Inference from a saved checkpoint: load the seed CNN's weights and predict digits.

    python examples/inference.py runs/seed_cnn_example/best.safetensors   # a Learner checkpoint (seed_cnn.py)
    python examples/inference.py runs/seed_cnn_manual/model.safetensors   # plain weights (seed_cnn_manual_loop.py)
    python examples/inference.py --quick      # trains 1 quick epoch into a temp dir, then loads it back

A checkpoint from a different model is refused with the missing, unexpected and mismatched keys.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import ember
from ember_train.checkpoint import load_model_weights
from ember_train.datasets import digits
from ember_train.models import SeedCNN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", help="a .safetensors checkpoint or weights file")
    parser.add_argument("--count", type=int, default=10, help="how many validation digits to show")
    parser.add_argument("--quick", action="store_true", help="make a checkpoint with a 1-epoch quick run first")
    args = parser.parse_args(argv)

    path = args.checkpoint
    if path is None:
        if not args.quick:
            parser.error("give a checkpoint path (or --quick to make one)")
        import seed_cnn_manual_loop  # the sibling example: one quick epoch, weights saved with ember.records

        path = os.path.join(tempfile.mkdtemp(prefix="ember-infer-"), "model.safetensors")
        seed_cnn_manual_loop.main(["--quick", "--out", path])

    device = ember.Device.default()  # no autodiff needed: inference only
    model = SeedCNN().to(device)
    report = load_model_weights(model, path)  # raises, naming the keys, if the checkpoint is another model's
    print(f"loaded {path}: {report}")
    model.eval()

    valid = digits("valid")
    x = np.stack([valid[i][0] for i in range(len(valid))])
    y = np.array([int(valid[i][1]) for i in range(len(valid))])
    with ember.no_grad():
        logits = model(ember.tensor(x, device=device))
        probs = ember.nn.functional.softmax(logits, dim=1).numpy()
    pred = probs.argmax(axis=1)
    for i in range(min(args.count, len(y))):
        print(f"digit {i}: predicted {pred[i]} (p={probs[i, pred[i]]:.2f}), true {y[i]}")
    print(f"validation accuracy {(pred == y).mean():.2%} on {len(y)} digits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
