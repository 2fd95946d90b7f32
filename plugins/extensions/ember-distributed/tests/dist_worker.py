"""Rank programs of the ember-distributed tests, run as ``mpiexec -n N python dist_worker.py SCENARIO OUTDIR``.

Each rank writes what it computed to ``OUTDIR/<scenario>-rank<r>.npz``; the tests compare the files with numpy (or
with a single-process run) in the pytest process. Inputs are pure functions of the rank, so the test can rebuild
every rank's input.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

import ember
from ember import nn

SHAPE = (3, 4)


def rank_input(r: int, dtype: str = "float32", shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    """Rank ``r``'s input for the collective tests."""
    a = np.random.default_rng(100 + r).standard_normal(shape) * 4
    return a.astype(dtype) if np.dtype(dtype).kind == "f" else np.round(a).astype(dtype)


def collectives(outdir: str) -> None:
    dist = ember.distributed
    dist.init("mpi", timeout=60)
    r, n = dist.rank(), dist.world_size()
    out: dict[str, np.ndarray] = {}
    for dev in ("flex", "flex+autodiff"):
        for op in ("sum", "avg", "max", "min", "product"):
            t = ember.tensor(rank_input(r), device=dev)
            dist.all_reduce(t, op=dist.ReduceOp[op.upper()])
            out[f"all_reduce_{op}_{dev}"] = t.numpy().copy()
    for dtype in ("float64", "int32", "float16"):  # float16: staged through float32
        t = ember.tensor(rank_input(r, dtype), device="flex")
        dist.all_reduce(t, op="sum")
        out[f"all_reduce_sum_{dtype}"] = t.numpy().copy()
    t = ember.tensor(rank_input(r), device="flex")
    work = dist.all_reduce(t, op="max", async_op=True)
    work.wait()
    out["all_reduce_async_max"] = t.numpy().copy()
    out["async_completed"] = np.array(work.is_completed())
    t = ember.tensor(rank_input(r), device="flex")
    dist.broadcast(t, src=n - 1)
    out["broadcast"] = t.numpy().copy()
    lst = [ember.zeros(SHAPE, device="flex") for _ in range(n)]
    dist.all_gather(lst, ember.tensor(rank_input(r), device="flex+autodiff"))
    out["all_gather"] = np.stack([x.numpy() for x in lst])
    big = ember.zeros((n * SHAPE[0], SHAPE[1]), device="flex")
    dist.all_gather_into_tensor(big, ember.tensor(rank_input(r), device="flex"), async_op=True).wait()
    out["all_gather_into_tensor"] = big.numpy().copy()
    o = ember.zeros(SHAPE, device="flex")
    dist.reduce_scatter(o, [ember.tensor(rank_input(r) + k, device="flex") for k in range(n)], op="sum")
    out["reduce_scatter"] = o.numpy().copy()
    o = ember.zeros((1, SHAPE[1]), device="flex")
    dist.reduce_scatter_tensor(o, ember.tensor(rank_input(r, shape=(n, SHAPE[1])), device="flex"), op="max")
    out["reduce_scatter_tensor_max"] = o.numpy().copy()
    dist.barrier()
    sub = dist.new_group([n - 1])  # only the last rank
    out["subgroup_rank"] = np.array(sub.rank())
    if sub.rank() == 0:
        t = ember.tensor(rank_input(r), device="flex")
        dist.all_reduce(t, group=sub)  # a group of one: unchanged
        out["subgroup_all_reduce"] = t.numpy().copy()
    rev = dist.new_group(list(range(n))[::-1])
    out["reversed_group_rank"] = np.array(rev.rank())
    objs: list = [None] * n
    dist.all_gather_object(objs, {"rank": r, "name": "x" * (r + 1)})
    out["objects"] = np.array([o["name"] for o in objs])
    lst2 = [r, "mine"]
    dist.broadcast_object_list(lst2, src=0)
    out["broadcast_object"] = np.array([str(x) for x in lst2])
    np.savez(os.path.join(outdir, f"collectives-rank{r}.npz"), **out)


# --- DDP -------------------------------------------------------------------------------------------------------

def mlp() -> nn.Module:
    """A small MLP (no batch norm: its batch statistics are per rank, so DDP does not equal one process with it)."""
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))


def cnn() -> nn.Module:
    """The seed CNN's shape, scaled to 8x8 inputs (two conv blocks and a linear head)."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 2 * 2, 3))


def data(kind: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of the task (inputs, int64 class targets), the same on every rank."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, 8) if kind == "mlp" else (n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int64)
    return x, y


def train(kind: str, steps: int, batch: int, world: int, rank: int, ddp: bool, bucket_cap_mb: float = 25,
          accumulate: int = 1) -> nn.Module:
    """SGD on the global batches ``[s*batch, (s+1)*batch)``; with DDP each rank takes its contiguous share of each
    global batch (a short last share when ``batch`` is not a multiple of ``world``, weighted so the average over
    ranks equals the global mean loss)."""
    ember.manual_seed(0)
    dev = ember.Device.parse("flex").autodiff()
    model = (mlp() if kind == "mlp" else cnn()).to(dev)
    if rank != 0:  # different local init: the wrap must broadcast rank 0's parameters
        with ember.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    net = ember.distributed.DataParallel(model, bucket_cap_mb=bucket_cap_mb) if ddp else model
    opt = ember.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = data(kind, steps * batch * accumulate)
    lossf = nn.CrossEntropyLoss(reduction="sum")
    for s in range(steps):
        opt.zero_grad()
        for a in range(accumulate):
            lo = (s * accumulate + a) * batch
            xs, ys = x[lo:lo + batch], y[lo:lo + batch]
            if ddp:  # this rank's share of the global batch
                bounds = np.linspace(0, batch, world + 1).round().astype(int)
                xs, ys = xs[bounds[rank]:bounds[rank + 1]], ys[bounds[rank]:bounds[rank + 1]]
            ctx = net.no_sync() if ddp and a < accumulate - 1 else _null()
            with ctx:
                out = net(ember.tensor(xs, device=dev))
                # local sum x world / global batch: DDP's average over ranks is then the global mean's gradient
                loss = lossf(out, ember.tensor(ys, device=dev)) * (world if ddp else 1) / (batch * accumulate)
                loss.backward()
        opt.step()
    return model


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def ddp(outdir: str, kind: str, steps: str, batch: str, accumulate: str = "1", cap: str = "25") -> None:
    ember.distributed.init("mpi", timeout=120)
    _ddp_run(outdir, kind, steps, batch, accumulate, cap)


def _ddp_run(outdir: str, kind: str, steps: str, batch: str, accumulate: str = "1", cap: str = "25") -> None:
    dist = ember.distributed
    r, n = dist.rank(), dist.world_size()
    t0 = time.perf_counter()
    model = train(kind, int(steps), int(batch), n, r, True, float(cap), int(accumulate))
    elapsed = time.perf_counter() - t0
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    sd["__elapsed"] = np.array(elapsed)
    np.savez(os.path.join(outdir, f"ddp-{kind}-rank{r}.npz"), **sd)


def unused(outdir: str) -> None:
    """A model with a branch the loss never uses: without find_unused_parameters the next forward raises."""
    ember.distributed.init("mpi", timeout=60)
    _unused_run(outdir)


def _unused_run(outdir: str) -> None:
    dist = ember.distributed
    r = dist.rank()
    dev = ember.Device.parse("flex").autodiff()
    res = {}
    for find in (False, True):
        ember.manual_seed(0)
        model = nn.ModuleDict({"used": nn.Linear(4, 2), "unused": nn.Linear(4, 2)}).to(dev)

        class Net(nn.Module):
            def __init__(self, m: nn.Module) -> None:
                super().__init__()
                self.m = m

            def forward(self, x: ember.Tensor) -> ember.Tensor:
                return self.m["used"](x)

        net = dist.DataParallel(Net(model), find_unused_parameters=find)
        x = ember.tensor(np.full((2, 4), r + 1.0, dtype=np.float32), device=dev)
        net(x).sum().backward()
        try:
            net(x).sum().backward()
            res[f"find{find}"] = "ok"
        except dist.DistributedError as exc:
            res[f"find{find}"] = f"{type(exc).__name__}: {exc}"
        res[f"grad{find}"] = model["used"].weight.grad.numpy().copy()
        res[f"unused_grad_is_none{find}"] = model["unused"].weight.grad is None
    # a branch only rank 0 runs: rank 1 contributes zeros, both end with rank 0's gradient / 2
    ember.manual_seed(0)
    parts = nn.ModuleDict({"trunk": nn.Linear(4, 2), "branch": nn.Linear(4, 2)}).to(dev)

    class Branchy(nn.Module):
        def __init__(self, m: nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: ember.Tensor) -> ember.Tensor:
            out = self.m["trunk"](x)
            return out + self.m["branch"](x) if r == 0 else out

    net = dist.DataParallel(Branchy(parts), find_unused_parameters=True)
    net(ember.ones((2, 4), device=dev)).sum().backward()
    res["branch_grad"] = parts["branch"].weight.grad.numpy().copy()
    res["branch_bias_grad"] = parts["branch"].bias.grad.numpy().copy()
    # buffers: rank 0's running statistics reach every rank at a training-mode forward
    bn = nn.BatchNorm1d(3).to(dev)
    with ember.no_grad():
        bn.running_mean.fill_(float(r + 5))
    net = dist.DataParallel(bn)
    res["bn_mean_after_wrap"] = bn.running_mean.numpy().copy()
    with ember.no_grad():
        bn.running_mean.fill_(float(r + 7))
    net.eval()
    net(ember.zeros((2, 3), device=dev))
    res["bn_mean_eval"] = bn.running_mean.numpy().copy()  # eval: no broadcast, stays the rank's own
    net.train()
    with ember.no_grad():
        net(ember.zeros((2, 3), device=dev))  # broadcast 7 from rank 0, then momentum 0.1 towards batch mean 0
    res["bn_mean_train"] = bn.running_mean.numpy().copy()
    np.savez(os.path.join(outdir, f"unused-rank{r}.npz"), **{k: np.array(v) for k, v in res.items()})


def training(outdir: str) -> None:
    """The DDP scenarios in one launch (each launch pays two interpreter and ember start-ups): the MLP in small
    buckets, the CNN with an uneven batch and no_sync accumulation, unused parameters and buffers."""
    ember.distributed.init("mpi", timeout=120)
    _ddp_run(outdir, "mlp", "4", "10", "1", "0.001")
    _ddp_run(outdir, "cnn", "3", "9", "2")
    _unused_run(outdir)


def crash(outdir: str) -> None:
    """Rank 1 raises after one collective: the job ends at once with its traceback (fail fast), well before rank
    0's collective would time out."""
    dist = ember.distributed
    dist.init("mpi", timeout=60)
    t = ember.ones(4, device="flex")
    dist.all_reduce(t)
    if dist.rank() == 1:
        raise ValueError("a bug on rank 1")
    dist.all_reduce(t)
    print("RESULT rank 0 finished", flush=True)


def killed(outdir: str) -> None:
    """Rank 1 dies after one collective; rank 0's next collective must raise a typed error within the timeout."""
    dist = ember.distributed
    dist.init("mpi", timeout=float(os.environ.get("WORKER_TIMEOUT", "5")))
    r = dist.rank()
    t = ember.ones(4, device="flex")
    dist.all_reduce(t)
    if r == 1:
        os._exit(9)
    t0 = time.perf_counter()
    try:
        dist.all_reduce(t)
        print("RESULT no error", flush=True)
    except dist.DistributedTimeoutError as exc:
        print(f"RESULT {type(exc).__name__} after {time.perf_counter() - t0:.1f}s: {exc}", flush=True)
        raise


def fit_learner(out_dir: str, epochs: int, batch: int, strategy: str | None, resume: str | None = None) -> Any:
    """A Learner on the 48-sample MLP task (shuffled loader, seed 3); returns (model, history)."""
    from ember_train.data import DataLoader, TensorDataset
    from ember_train.learner import Learner

    ember.manual_seed(0)
    dev = ember.Device.parse("flex").autodiff()
    model = mlp().to(dev)
    x, y = data("mlp", 48)
    train_loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, seed=3, device=dev)
    valid_loader = DataLoader(TensorDataset(x[:12], y[:12]), batch_size=12, device=dev)
    opt = ember.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    learner = Learner(model, train_loader, valid_loader, loss_fn=nn.CrossEntropyLoss(), optimizer=opt,
                      out_dir=out_dir, dashboard="none", strategy=strategy)
    history = learner.fit(epochs, resume=resume)
    return model, history


def learner(outdir: str) -> None:
    """Learner(strategy="ddp"): 2 epochs, then a new Learner resumes to 3; batch 6 per rank (12 in all)."""
    dist = ember.distributed
    dist.init("mpi", timeout=120)
    r = dist.rank()
    run = os.path.join(outdir, "run")
    _, h2 = fit_learner(run, 2, 6, "ddp")
    files_after_2 = sorted(os.listdir(run))
    model, h3 = fit_learner(run, 3, 6, "ddp", resume="latest")
    res = {k: v.numpy() for k, v in model.state_dict().items()}
    res["__train_loss"] = np.array(h3["train_loss"])
    res["__valid_accuracy"] = np.array(h3["valid_accuracy"])
    res["__files_after_2"] = np.array(files_after_2)
    np.savez(os.path.join(outdir, f"learner-rank{r}.npz"), **res)


if __name__ == "__main__":
    scenario, args = sys.argv[1], sys.argv[2:]
    {"collectives": collectives, "ddp": ddp, "unused": unused, "killed": killed, "learner": learner,
     "training": training, "crash": crash}[scenario](*args)
