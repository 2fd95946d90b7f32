"""DataLoader(sampler=...): a sampler (torch's DistributedSampler as the oracle) decides the order, per epoch."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import ValueRangeError
from ember_train.data import DataLoader, IterableDataset, TensorDataset


class Shard:
    """Rank ``rank``'s strided share of ``range(n)``, reshuffled per epoch (a DistributedSampler's shape)."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        self.n, self.rank, self.world, self.epoch = n, rank, world, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(np.random.default_rng(self.epoch).permutation(self.n)[self.rank::self.world].tolist())

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))


def _ds(n: int = 10) -> TensorDataset:
    return TensorDataset(np.arange(n, dtype=np.float32).reshape(n, 1), np.arange(n))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_matches_torch_dataloader_with_distributed_sampler(shuffle: bool, drop_last: bool) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader as TorchLoader
    from torch.utils.data.distributed import DistributedSampler

    data = np.arange(11)
    for rank in range(3):
        for epoch in (0, 1):
            ts = DistributedSampler(data, num_replicas=3, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last)
            ts.set_epoch(epoch)
            want = [b.tolist() for b in TorchLoader(torch.as_tensor(data), batch_size=2, sampler=ts)]
            same = DistributedSampler(data, num_replicas=3, rank=rank, shuffle=shuffle, seed=5,
                                        drop_last=drop_last)
            loader = DataLoader(TensorDataset(data), batch_size=2, sampler=same)
            loader.set_epoch(epoch)  # the loader sets the sampler's epoch itself
            got = [b[0].numpy().tolist() for b in loader]
            assert got == want, (rank, epoch)
            assert len(loader) == len(want)


def test_shards_disjoint_and_epoch_order() -> None:
    ds = _ds(10)
    seen = []
    for rank in range(2):
        loader = DataLoader(ds, batch_size=3, sampler=Shard(10, rank, 2))
        assert len(loader) == 2
        e0 = [i for b in loader for i in b[1].numpy().tolist()]
        e1 = [i for b in loader for i in b[1].numpy().tolist()]  # the next pass is epoch 1
        assert e0 == np.random.default_rng(0).permutation(10)[rank::2].tolist()
        assert e1 == np.random.default_rng(1).permutation(10)[rank::2].tolist()
        seen += e0
    assert sorted(seen) == list(range(10))


def test_resume_mid_epoch_with_sampler() -> None:
    loader = DataLoader(_ds(10), batch_size=2, sampler=Shard(10, 1, 2))
    loader.set_epoch(3)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    rest = [b[1].numpy().tolist() for b in it]
    again = DataLoader(_ds(10), batch_size=2, sampler=Shard(10, 1, 2))
    again.load_state_dict(state)
    assert [b[1].numpy().tolist() for b in again] == rest
    assert "sampler=Shard" in repr(again)


def test_bad_sampler_arguments() -> None:
    with pytest.raises(ValueRangeError, match="mutually exclusive with shuffle"):
        DataLoader(_ds(), shuffle=True, sampler=Shard(10, 0, 1))
    with pytest.raises(ValueRangeError, match="iterable of indices with a length"):
        DataLoader(_ds(), sampler=3)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueRangeError, match="map-style"):
        DataLoader(Stream(), sampler=Shard(3, 0, 1))
