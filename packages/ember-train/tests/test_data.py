"""DataLoader, datasets wrappers, collation and transforms."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import ember
from ember_train import transforms as T
from ember_train.data import (
    DataLoader,
    IterableDataset,
    Subset,
    TensorDataset,
    TransformDataset,
    collate_host,
    default_collate,
    random_split,
)
from ember_train.errors import CollateError


def _ds(n: int = 23) -> TensorDataset:
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    return TensorDataset(x, np.arange(n, dtype=np.int64))


def _labels(loader: DataLoader) -> list[list[int]]:
    return [b[1].numpy().tolist() for b in loader]


def test_batches_are_tensors_on_device_in_order():
    dl = DataLoader(_ds(), batch_size=5, device="flex")
    batches = list(dl)
    assert len(dl) == len(batches) == 5
    x, y = batches[0]
    assert isinstance(x, ember.Tensor) and x.dtype == ember.float32 and tuple(x.shape) == (5, 3)
    assert y.dtype == ember.int64 and str(x.device) == "flex"
    np.testing.assert_array_equal(x.numpy(), np.arange(15, dtype=np.float32).reshape(5, 3))
    assert tuple(batches[-1][0].shape) == (3, 3)


def test_drop_last():
    dl = DataLoader(_ds(23), batch_size=5, drop_last=True)
    assert len(dl) == 4
    assert sum(len(b) for b in _labels(dl)) == 20


def test_shuffle_reproducible_and_epoch_dependent():
    a = DataLoader(_ds(), batch_size=4, shuffle=True, seed=7)
    b = DataLoader(_ds(), batch_size=4, shuffle=True, seed=7)
    a.set_epoch(3)
    b.set_epoch(3)
    la, lb = _labels(a), _labels(b)
    assert la == lb
    assert sorted(sum(la, [])) == list(range(23))
    expected = np.random.default_rng(7 + 3).permutation(23).tolist()
    assert sum(la, []) == expected
    b.set_epoch(4)
    assert _labels(b) != la
    c = DataLoader(_ds(), batch_size=4, shuffle=True, seed=8)
    c.set_epoch(3)
    assert _labels(c) != la


def test_full_pass_advances_epoch_and_break_does_not():
    dl = DataLoader(_ds(), batch_size=4, shuffle=True, seed=1)
    first = _labels(dl)
    assert dl.epoch == 1
    second = _labels(dl)
    assert second != first and dl.epoch == 2
    for _ in dl:
        break
    assert dl.epoch == 2 and dl.state_dict()["position"] == 1


@pytest.mark.parametrize("workers", [0, 3])
def test_state_dict_resume_mid_epoch(workers):
    ref = DataLoader(_ds(), batch_size=4, shuffle=True, seed=5)
    ref.set_epoch(2)
    full = _labels(ref)
    dl = DataLoader(_ds(), batch_size=4, shuffle=True, seed=5, num_workers=workers)
    dl.set_epoch(2)
    it = iter(dl)
    got = [next(it)[1].numpy().tolist() for _ in range(2)]
    state = dl.state_dict()
    assert state == {"epoch": 2, "seed": 5, "position": 2}
    it.close()
    fresh = DataLoader(_ds(), batch_size=4, shuffle=True, seed=999, num_workers=workers)
    fresh.load_state_dict(state)
    rest = _labels(fresh)
    assert got + rest == full
    assert fresh.epoch == 3 and fresh.state_dict()["position"] == 0
    # the resume point is consumed: the next pass is a whole epoch
    assert len(_labels(fresh)) == len(full)


def test_load_state_dict_rejects_bad_state():
    dl = DataLoader(_ds(), batch_size=4)
    with pytest.raises(ember.ValueRangeError, match="lacks"):
        dl.load_state_dict({"epoch": 0})
    with pytest.raises(ember.ValueRangeError, match="position 99"):
        dl.load_state_dict({"epoch": 0, "seed": 0, "position": 99})


def test_seed_none_is_kept_in_state():
    dl = DataLoader(_ds(), batch_size=4, shuffle=True)
    order = _labels(dl)
    other = DataLoader(_ds(), batch_size=4, shuffle=True, seed=0)
    other.load_state_dict({**dl.state_dict(), "epoch": 0})
    assert _labels(other) == order


@pytest.mark.parametrize("workers,prefetch", [(1, 1), (2, 2), (4, 3)])
def test_workers_match_no_workers(workers, prefetch):
    base = _labels(DataLoader(_ds(101), batch_size=7, shuffle=True, seed=3))
    got = _labels(DataLoader(_ds(101), batch_size=7, shuffle=True, seed=3, num_workers=workers, prefetch=prefetch))
    assert got == base


def _worker_threads() -> int:
    return sum(t.name.startswith("ember-data") for t in threading.enumerate())


def test_early_break_shuts_workers_down():
    dl = DataLoader(_ds(200), batch_size=2, num_workers=3)
    for k, _ in enumerate(dl):
        if k == 2:
            break
    assert _worker_threads() == 0


class _Boom(TensorDataset):
    def __getitem__(self, index):
        if index == 13:
            raise KeyError("bad record 13")
        return super().__getitem__(index)


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_exception_propagates(workers):
    x = np.zeros((30, 2), np.float32)
    dl = DataLoader(_Boom(x), batch_size=4, num_workers=workers)
    seen = []
    with pytest.raises(KeyError, match="bad record 13"):
        for (b,) in dl:
            seen.append(b)
    assert len(seen) == 3  # batches 0..2 were delivered, batch 3 holds index 13
    assert _worker_threads() == 0


class _Stream(IterableDataset):
    def __init__(self, n, fail_at=None):
        self.n, self.fail_at = n, fail_at

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise RuntimeError("stream broke")
            yield np.float32(i), i


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset(workers):
    dl = DataLoader(_Stream(10), batch_size=4, num_workers=workers)
    got = [b[1].numpy().tolist() for b in dl]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dl2 = DataLoader(_Stream(10), batch_size=4, drop_last=True, num_workers=workers)
    assert [b[1].numpy().tolist() for b in dl2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(TypeError, match="unknown"):
        len(dl)
    with pytest.raises(RuntimeError, match="stream broke"):
        list(DataLoader(_Stream(10, fail_at=6), batch_size=2, num_workers=workers))
    for _ in DataLoader(_Stream(1000), batch_size=2, num_workers=workers):
        break
    assert _worker_threads() == 0
    # resume skips batches already handed out
    r = DataLoader(_Stream(10), batch_size=4, num_workers=workers)
    r.load_state_dict({"epoch": 0, "seed": 0, "position": 1})
    assert [b[1].numpy().tolist() for b in r] == [[4, 5, 6, 7], [8, 9]]


def test_iterable_shuffle_rejected():
    with pytest.raises(ember.ValueRangeError, match="shuffle=True needs a map-style"):
        DataLoader(_Stream(3), shuffle=True)


@pytest.mark.parametrize("kw,msg", [({"batch_size": 0}, "batch_size"), ({"num_workers": -1}, "num_workers"),
                                    ({"prefetch": 0}, "prefetch")])
def test_bad_loader_args(kw, msg):
    with pytest.raises(ember.ValueRangeError, match=msg):
        DataLoader(_ds(), **kw)


def test_collate_dtypes_follow_torch():
    batch = [(1.5, 2, True, np.float64(1.0), np.ones(2, np.float64), np.ones(2, np.uint8)),
             (2.5, 3, False, np.float64(2.0), np.ones(2, np.float64), np.ones(2, np.uint8))]
    ours = default_collate(batch)
    theirs = torch.utils.data.default_collate(batch)
    for o, t in zip(ours, theirs):
        assert str(o.dtype) == str(t.dtype).replace("torch.", "")
        np.testing.assert_array_equal(o, t.numpy())


def test_collate_ember_tensors_and_custom_collate():
    items = [(ember.tensor([1.0, 2.0]), np.int64(0)), (ember.tensor([3.0, 4.0]), np.int64(1))]
    x, y = DataLoader(items, batch_size=2).check()
    np.testing.assert_array_equal(x.numpy(), [[1.0, 2.0], [3.0, 4.0]])
    assert x.dtype == ember.float32 and y.dtype == ember.int64

    def sum_collate(batch):
        return {"total": np.array([sum(float(b[0].sum()) for b in batch)])}

    (out,) = list(DataLoader(items, batch_size=2, collate_fn=sum_collate))
    assert isinstance(out["total"], ember.Tensor) and out["total"].numpy().tolist() == [10.0]


def test_collate_errors_name_field_item_and_shapes():
    items = [(np.zeros((1, 28, 28), np.float32), 0)] * 3 + [(np.zeros((3, 28), np.float32), 1)]
    dl = DataLoader(items, batch_size=4)
    with pytest.raises(CollateError, match=r"field 0 of item 3 \(dataset index 3\) has shape \(3, 28\) but item 0 "
                                           r"\(dataset index 0\) has shape \(1, 28, 28\)"):
        dl.check()
    with pytest.raises(ember.EmberError):
        next(iter(dl))
    with pytest.raises(CollateError, match=r"field 1 of item 1 is a str 'cat'"):
        collate_host([(1.0, 2), (1.0, "cat")])
    with pytest.raises(CollateError, match="item 1 has 1 fields but item 0 has 2"):
        collate_host([(1.0, 2), (1.0,)])
    with pytest.raises(CollateError, match="uint16"):
        collate_host([np.zeros(2, np.uint16)])
    with pytest.raises(CollateError, match="empty batch"):
        collate_host([])
    assert issubclass(CollateError, TypeError)


def test_check_on_empty_loader():
    with pytest.raises(ember.ValueRangeError, match="no batches"):
        DataLoader(_ds(3), batch_size=4, drop_last=True).check()


def test_tensor_dataset_and_subset_and_split():
    with pytest.raises(ember.ShapeError, match=r"\(3, 2\), \(4,\)"):
        TensorDataset(np.zeros((3, 2)), np.zeros(4))
    ds = TensorDataset(ember.tensor([[1.0], [2.0], [3.0]]), np.array([0, 1, 2]))
    assert len(ds) == 3 and ds[1][0].tolist() == [2.0]
    sub = Subset(ds, [2, 0])
    assert [int(sub[i][1]) for i in range(2)] == [2, 0]
    with pytest.raises(ember.ValueRangeError, match="out of range"):
        Subset(ds, [5])
    big = _ds(100)
    a, b = random_split(big, [70, 30], seed=1)
    ia, ib = set(a.indices), set(b.indices)
    assert len(a) == 70 and len(b) == 30 and not ia & ib and ia | ib == set(range(100))
    assert random_split(big, [70, 30], seed=1)[0].indices == a.indices
    assert random_split(big, [70, 30], seed=2)[0].indices != a.indices
    fa, fb, fc = random_split(big, [0.5, 0.25, 0.25])
    assert (len(fa), len(fb), len(fc)) == (50, 25, 25)
    with pytest.raises(ember.ValueRangeError, match="sum to 90"):
        random_split(big, [60, 30])


def test_transforms():
    x = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    f = T.ToFloat()(x)
    assert f.dtype == np.float32 and f.max() == pytest.approx(31 / 255)
    n = T.Normalize([1.0, 2.0], [2.0, 4.0])(np.ones((2, 3, 3), np.float32))
    np.testing.assert_allclose(n[0], 0.0)
    np.testing.assert_allclose(n[1], -0.25)
    with pytest.raises(ember.ShapeError, match="2 channel"):
        T.Normalize([1.0, 2.0], [1.0, 1.0])(np.ones((3, 3, 3)))
    with pytest.raises(ember.ValueRangeError):
        T.Normalize(0.0, 0.0)
    crop = T.RandomCrop(4, padding=2)
    outs = {crop(x, rng=np.random.default_rng(s)).tobytes() for s in range(20)}
    assert len(outs) > 1 and all(len(o) == x.nbytes for o in outs)
    same = T.RandomCrop(4, padding=2)(x, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(same, crop(x, rng=np.random.default_rng(3)))
    flip = T.RandomHorizontalFlip(p=1.0)
    np.testing.assert_array_equal(flip(x), x[..., ::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(p=0.0)(x), x)
    comp = T.Compose([T.ToFloat(), lambda a: a * 2, T.RandomHorizontalFlip(p=1.0)])
    np.testing.assert_allclose(comp(x), (x / 255.0 * 2)[..., ::-1], rtol=1e-6)


def test_transform_dataset_reproducible_with_workers():
    x = np.random.default_rng(0).random((40, 1, 6, 6)).astype(np.float32)
    aug = T.Compose([T.RandomCrop(6, padding=2), T.RandomHorizontalFlip()])

    def run(workers, epoch):
        ds = TransformDataset(TensorDataset(x, np.arange(40)), aug, seed=11)
        dl = DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=workers)
        dl.set_epoch(epoch)
        return np.concatenate([b[0].numpy() for b in dl])

    np.testing.assert_array_equal(run(0, 1), run(3, 1))
    assert not np.array_equal(run(0, 1), run(0, 2))
