"""ember's main job: ``ember train seed-cnn`` on the default device.

The seed CNN (docs/models.md) learns the UCI handwritten digits (bundled with scikit-learn, resized to
28x28; nothing downloads) with the Learner: a live dashboard on a terminal (plain log lines otherwise),
checkpoints and metric logs in ``runs/seed-cnn``, then the final validation accuracy and the time taken.
Arguments pass through to ``ember train seed-cnn`` (``--epochs``, ``--batch-size``, ``--lr``, ``--out``,
``--resume``, ``--overwrite``, ``--quick``, ``--device``); ``EMBER_DEVICE=NAME`` picks another default device.
A run owns its checkpoint folder, so a repeated demo starts a fresh run with ``--overwrite`` (the previous run's
files are moved aside into ``runs/seed-cnn/replaced-*``, never deleted) unless ``--resume`` is given.

    ./scripts/demo.sh                          # set up, then run this
    .venv/bin/python scripts/demo.py --quick   # a few batches
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ember_train import cli


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not {"--resume", "--overwrite"} & set(args):
        args.append("--overwrite")
    return cli.main(["seed-cnn", *args])


if __name__ == "__main__":
    sys.exit(main())
