"""``Learner(..., strategy="ddp")``: ember-train's data-parallel strategy (entry-point group
``ember_train.strategies``, so ember-train never imports this package).

Every rank builds the same Learner; the strategy initializes the default process group (when the script did not),
wraps the model in :class:`~ember_distributed.ddp.DistributedDataParallel`, gives the training loader a
:class:`~ember_distributed.sampler.DistributedSampler` shard that follows the loader's seed and epoch (so resume
stays exact), lets rank 0 alone write logs, checkpoints and the dashboard, and combines the epoch metrics: training
metrics averaged over ranks (equal shards, so the average is the mean over the padded training set), throughput
summed, epoch time the slowest rank's. The validation loader is not sharded: every rank evaluates the whole set, so
validation metrics are exact and identical on every rank.
"""

from __future__ import annotations

from typing import Any

from .collectives import all_gather_object, barrier, broadcast_object_list
from .ddp import DistributedDataParallel
from .group import ProcessGroup, default_group, init, is_initialized
from .sampler import DistributedSampler


class _LoaderSeededSampler(DistributedSampler):
    """A DistributedSampler whose shuffle seed is its loader's (restored by the loader's ``load_state_dict``)."""

    def __init__(self, loader: Any, group: ProcessGroup) -> None:
        self._loader = loader
        super().__init__(loader.dataset, num_replicas=group.size(), rank=group.rank(), shuffle=loader.shuffle,
                         seed=0, drop_last=False)

    @property
    def seed(self) -> int:  # type: ignore[override]
        """The loader's seed (the same on every rank: broadcast from rank 0 at setup, or read from a checkpoint)."""
        return int(self._loader.seed)

    @seed.setter
    def seed(self, value: int) -> None:
        pass  # the loader owns the seed


class DDPStrategy:
    """ember-train's ``"ddp"`` strategy (see the module docstring). ``backend``: the engine :func:`init` uses when
    no process group exists yet; the other arguments go to DistributedDataParallel."""

    name = "ddp"

    def __init__(self, backend: str = "auto", bucket_cap_mb: float = 25, find_unused_parameters: bool = False,
                 broadcast_buffers: bool = True) -> None:
        if not is_initialized():
            init(backend)
        self.group = default_group("Learner(strategy='ddp')")
        self.ddp_options = {"bucket_cap_mb": bucket_cap_mb, "find_unused_parameters": find_unused_parameters,
                            "broadcast_buffers": broadcast_buffers}

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, checkpoints and shows the dashboard."""
        return self.group.rank() == 0

    def setup(self, learner: Any) -> DistributedDataParallel:
        """Shard the training loader (an ember-train DataLoader without a sampler) and wrap the model."""
        loader = learner.train_loader
        if (getattr(loader, "sampler", "absent") is None and not getattr(loader, "iterable", True)
                and self.group.size() > 1):
            loader.seed = self.broadcast_object(loader.seed)  # one shuffle for all ranks
            loader.sampler = _LoaderSeededSampler(loader, self.group)
            loader.shuffle = False  # the sampler shuffles now
        return DistributedDataParallel(learner.model, process_group=self.group, **self.ddp_options)

    def reduce_metrics(self, record: dict[str, Any]) -> dict[str, Any]:
        """Training metrics averaged over ranks, ``samples_per_sec`` summed, ``epoch_time`` the maximum; the
        rest (epoch, lr, validation metrics, grad_norm) are the same on every rank and kept."""
        if self.group.size() == 1:
            return record
        records: list[Any] = [None] * self.group.size()
        all_gather_object(records, record, self.group)
        out = dict(record)
        for k in record:
            vals = [r.get(k) for r in records]
            if any(x is None for x in vals):
                continue
            if k == "samples_per_sec":
                out[k] = float(sum(vals))
            elif k == "epoch_time":
                out[k] = float(max(vals))
            elif k.startswith("train_"):
                out[k] = float(sum(vals) / len(vals))
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        broadcast_object_list(box, src=self.group.ranks[0], group=self.group)
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank."""
        barrier(self.group)
