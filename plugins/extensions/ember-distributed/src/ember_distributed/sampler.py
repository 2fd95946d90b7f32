"""``DistributedSampler``: each rank draws a disjoint shard of a map-style dataset (``torch.utils.data``'s
semantics: padding by repeating the first indices, or ``drop_last``; the shuffle reseeded per epoch)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from ember.errors import ValueRangeError


class DistributedSampler:
    """Indices of rank ``rank``'s shard of ``dataset`` (``torch.utils.data.distributed.DistributedSampler``).

    Every epoch all ranks take the same order, ``numpy.random.default_rng(seed + epoch).permutation(len)`` when
    ``shuffle`` (ember-train's DataLoader convention) or ``0..len-1``; it is padded with its own first indices to a
    multiple of ``num_replicas`` (or, with ``drop_last``, cut to one), and rank ``r`` takes positions
    ``r, r + num_replicas, ...``. So the shards are disjoint (except the padding) and together cover the dataset.
    Call :meth:`set_epoch` at the start of each epoch (ember-train's DataLoader does, given ``sampler=``).
    ``num_replicas`` / ``rank`` default to the default process group's.
    """

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            from .group import default_group

            g = default_group("DistributedSampler")
            num_replicas = g.size() if num_replicas is None else num_replicas
            rank = g.rank() if rank is None else rank
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
            raise ValueRangeError(f"DistributedSampler: num_replicas must be an int >= 1, got {num_replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_replicas:
            raise ValueRangeError(f"DistributedSampler: invalid rank {rank!r}, rank should be in the interval "
                                  f"[0, {num_replicas - 1}]")
        if not hasattr(dataset, "__len__"):
            raise ValueRangeError(f"DistributedSampler: {type(dataset).__name__} has no length (map-style datasets)")
        self.dataset = dataset
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        n = len(dataset)
        if self.drop_last and n % self.num_replicas != 0:
            self.num_samples = math.ceil((n - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(n).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            pad = self.total_size - len(indices)
            if pad <= len(indices):
                indices += indices[:pad]
            elif indices:
                indices += (indices * math.ceil(pad / len(indices)))[:pad]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle the next iteration uses (the same on every rank)."""
        self.epoch = int(epoch)

    def __repr__(self) -> str:
        return (f"DistributedSampler(num_replicas={self.num_replicas}, rank={self.rank}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last}, epoch={self.epoch})")
