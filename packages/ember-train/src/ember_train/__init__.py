"""ember-train: data, the Learner training loop, dashboard, checkpoints, and the ``ember train`` command."""

__version__ = "0.1.0"
