"""Collectives on 2 ranks (real ``mpiexec -n 2`` on localhost) against numpy; process-group errors in one process."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.errors import DTypeError, ValueRangeError

# the shared helpers load by path: the tests run under --import-mode=importlib (no sys.path entry)
_spec = importlib.util.spec_from_file_location("ember_distributed_test_helpers",
                                               Path(__file__).with_name("dist_helpers.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
check = _helpers.check
run_ranks = _helpers.run_ranks
worker_module = _helpers.worker_module

N = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, np.ndarray]]:
    out = tmp_path_factory.mktemp("collectives")
    check(run_ranks(N, "collectives", str(out), timeout=120))
    return [dict(np.load(out / f"collectives-rank{r}.npz")) for r in range(N)]


def inputs(dtype: str = "float32", shape: tuple[int, ...] | None = None) -> list[np.ndarray]:
    w = worker_module()
    return [w.rank_input(r, dtype, shape or w.SHAPE) for r in range(N)]


@pytest.mark.parametrize("dev", ["flex", "flex+autodiff"])
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "product"])
def test_all_reduce(results: list[dict[str, np.ndarray]], op: str, dev: str) -> None:
    x = np.stack(inputs())
    want = {"sum": x.sum(0), "avg": x.mean(0), "max": x.max(0), "min": x.min(0), "product": x.prod(0)}[op]
    for r in range(N):
        np.testing.assert_allclose(results[r][f"all_reduce_{op}_{dev}"], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float64", "int32", "float16"])
def test_all_reduce_dtypes(results: list[dict[str, np.ndarray]], dtype: str) -> None:
    want = np.stack(inputs(dtype)).astype(np.float64).sum(0)
    for r in range(N):
        got = results[r][f"all_reduce_sum_{dtype}"]
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3 if dtype == "float16" else 1e-12)


def test_async_all_reduce(results: list[dict[str, np.ndarray]]) -> None:
    for r in range(N):
        np.testing.assert_array_equal(results[r]["all_reduce_async_max"], np.stack(inputs()).max(0))
        assert results[r]["async_completed"]


def test_broadcast_all_gather(results: list[dict[str, np.ndarray]]) -> None:
    x = inputs()
    for r in range(N):
        np.testing.assert_array_equal(results[r]["broadcast"], x[N - 1])
        np.testing.assert_array_equal(results[r]["all_gather"], np.stack(x))
        np.testing.assert_array_equal(results[r]["all_gather_into_tensor"], np.concatenate(x))


def test_reduce_scatter(results: list[dict[str, np.ndarray]]) -> None:
    x = inputs()
    per_rank = np.stack(inputs(shape=(N, 3)))  # rank r's reduce_scatter_tensor input, shape (N, 4)
    per_rank = np.stack([worker_module().rank_input(r, shape=(N, 4)) for r in range(N)])
    for r in range(N):
        np.testing.assert_allclose(results[r]["reduce_scatter"], sum(x[q] + r for q in range(N)), rtol=1e-6)
        np.testing.assert_array_equal(results[r]["reduce_scatter_tensor_max"], per_rank.max(0)[r:r + 1])


def test_groups_and_objects(results: list[dict[str, np.ndarray]]) -> None:
    x = inputs()
    assert int(results[0]["subgroup_rank"]) == -1 and int(results[N - 1]["subgroup_rank"]) == 0
    np.testing.assert_array_equal(results[N - 1]["subgroup_all_reduce"], x[N - 1])
    assert [int(results[r]["reversed_group_rank"]) for r in range(N)] == list(range(N))[::-1]
    for r in range(N):
        assert results[r]["objects"].tolist() == ["x" * (q + 1) for q in range(N)]
        assert results[r]["broadcast_object"].tolist() == ["0", "mine"]


# --- one process ------------------------------------------------------------------------------------------------

def test_errors_without_init() -> None:
    dist = ember.distributed

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(dist.DistributedError, match="not initialized"):
        dist.all_reduce(ember.ones(2, device="flex"))
    with pytest.raises(dist.DistributedError, match="not initialized"):
        dist.rank()


def test_bad_arguments() -> None:
    dist = ember.distributed

    with pytest.raises(ValueRangeError, match="backend"):
        dist.init("gloo")
    with pytest.raises(ValueRangeError, match="ReduceOp"):
        dist.ReduceOp.of("mean", "all_reduce")
    with pytest.raises(ValueRangeError, match="timeout"):
        dist.init("mpi", timeout=-1)
    with pytest.raises(DTypeError, match="all_reduce: tensor must be an ember Tensor"):
        dist.all_reduce(np.ones(2))
    assert isinstance(dist.ReduceOp.of("max", "x"), dist.ReduceOp)


def test_sampler_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    DistributedSampler = ember.distributed.DistributedSampler
    for n, reps, drop in [(10, 3, False), (10, 3, True), (2, 5, False), (12, 4, False), (7, 2, True)]:
        data = list(range(n))
        for r in range(reps):
            ours = DistributedSampler(data, num_replicas=reps, rank=r, shuffle=False, drop_last=drop)
            theirs = TorchSampler(data, num_replicas=reps, rank=r, shuffle=False, drop_last=drop)
            assert list(ours) == list(theirs) and len(ours) == len(theirs), (n, reps, drop, r)
    del torch


def test_sampler_shards_and_epochs() -> None:
    DistributedSampler = ember.distributed.DistributedSampler
    data = list(range(11))
    shards = [DistributedSampler(data, num_replicas=3, rank=r, seed=4) for r in range(3)]
    e0 = [list(s) for s in shards]
    assert sorted(sum(e0, [])[:11]) != [] and set(sum(e0, [])) == set(data)
    assert all(len(s) == 4 for s in e0)  # 11 padded to 12
    for s in shards:
        s.set_epoch(1)
    e1 = [list(s) for s in shards]
    assert e1 != e0 and set(sum(e1, [])) == set(data)
    order = np.random.default_rng(4 + 1).permutation(11).tolist()
    assert e1[0] == (order + order[:1])[0::3]
    with pytest.raises(ValueRangeError, match="rank"):
        DistributedSampler(data, num_replicas=2, rank=2)
