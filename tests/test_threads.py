"""Thread safety across plugins: several threads sharing one device (and one decorator stack) get exactly what a
single thread gets, never crash, and keep their own grad mode.

Plugins are reached only through devices: ``flex`` (fused, the default), ``flex+fusion(enabled=False)``,
``flex+autodiff`` (autodiff over fusion) and ``opencl`` where an OpenCL platform exists. CI-sized: a few thousand
iterations in all. ``EMBER_THREAD_SOAK=1`` multiplies every iteration count by 20 (a soak run of minutes).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import nn
from ember.errors import EmberError

SCALE = 20 if os.environ.get("EMBER_THREAD_SOAK", "").strip() not in ("", "0") else 1
JOIN_TIMEOUT = 120 * SCALE  # a hang fails the test instead of the CI job

STACKS = ["flex", "flex+fusion(enabled=False)", "flex+autodiff", "opencl"]
TRAIN_STACKS = ["flex+autodiff", "flex+fusion(enabled=False)+autodiff", "opencl+autodiff"]


def _device(spec: str) -> ember.Device:
    try:
        return ember.Device.parse(spec)
    except EmberError as exc:
        if spec.startswith("opencl"):
            pytest.skip(f"no OpenCL platform: {exc}")
        raise


def _run_threads(targets: list[Callable[[], None]], switch_interval: float | None = None) -> None:
    """Run each target in its own thread; re-raise the first failure (with its thread's traceback).
    ``switch_interval`` (seconds) makes the interpreter switch threads more often, to widen race windows."""
    errors: list[BaseException] = []

    def guard(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(fn,), daemon=True) for fn in targets]
    previous = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT)
    finally:
        sys.setswitchinterval(previous)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise AssertionError("".join(traceback.format_exception(errors[0])))


def _inputs(k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + k)
    return rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal((24, 8)).astype(np.float32)


def _chain(dev: ember.Device, x_np: np.ndarray, w_np: np.ndarray) -> list[np.ndarray]:
    """Elementwise chains (fused), broadcasts, reductions, a matmul, softmax, where and an in-place update.
    On OpenCL a shorter chain: every distinct fused kernel is a program compile (seconds on a cold CPU driver)."""
    x = ember.tensor(x_np, device=dev)
    w = ember.tensor(w_np, device=dev)
    a = F.relu(x * 0.5 - 0.1) + x.abs()
    if dev.kind == "opencl":
        h = a @ w
        m = ember.where(h > 0, h * 2.0, h * 0.5)
        m.add_(h, alpha=0.5)
        return [a.sum(dim=0).numpy(), h.numpy(), m.numpy()]
    b = (a - a.mean(dim=1, keepdim=True)) / (a.std(dim=1, keepdim=True) + 1e-5)
    h = b @ w
    p = F.softmax(h, dim=1)
    m = ember.where(h > 0, h * 2.0, h.tanh())
    acc = m.clone()
    acc.add_(p, alpha=0.5)
    acc.mul_(0.25)
    return [a.sum(dim=0).numpy(), h.numpy(), p.numpy(), acc.numpy(), m.max(dim=1).values.numpy()]


# ----------------------------------------------------------------------------------------------------------------
# the issue's reproductions
# ----------------------------------------------------------------------------------------------------------------
def test_issue_repro_four_threads_relu_chain() -> None:
    # 4 threads x 3000 iterations of the reported chain crashed every run ("double free or corruption") with
    # fusion on: two threads ran one compiled numexpr program at once
    dev = _device("flex+fusion(eager_below=0)")
    n = 3000 * SCALE

    def work(k: int) -> Callable[[], None]:
        def run() -> None:
            x_np = np.random.default_rng(k).standard_normal((16, 64)).astype("f4")
            x = ember.tensor(x_np, device=dev)
            want = (F.relu(x * .5 - .1) + x.abs()).numpy()
            np.testing.assert_allclose(want, np.maximum(x_np * .5 - .1, 0) + np.abs(x_np), rtol=1e-6, atol=1e-6)
            for i in range(n):
                got = (F.relu(x * .5 - .1) + x.abs()).numpy()
                assert np.array_equal(got, want), f"thread {k} iteration {i}: max error {np.abs(got - want).max()}"

        return run

    _run_threads([work(k) for k in range(4)])


def test_issue_repro_no_grad_threads_beside_a_trainer() -> None:
    # two `with ember.no_grad(): model(x)` threads made the trainer's backward() fail on ~100 % of steps
    dev = _device("flex+autodiff")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(dev)
    opt = ember.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    x = ember.tensor(rng.standard_normal((32, 8)).astype("f4"), device=dev)
    y = ember.tensor(rng.standard_normal((32, 1)).astype("f4"), device=dev)
    stop = threading.Event()
    grad_off: list[int] = []

    def infer() -> None:
        while not stop.is_set():
            with ember.no_grad():
                model(x).numpy()
                assert not ember.is_grad_enabled()

    def train() -> None:
        try:
            for i in range(200 * SCALE):
                if not ember.is_grad_enabled():
                    grad_off.append(i)
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()  # raised AutodiffError ("does not require grad") while another thread was in no_grad
                opt.step()
        finally:
            stop.set()

    _run_threads([train, infer, infer])
    assert grad_off == []
    assert ember.is_grad_enabled()


# ----------------------------------------------------------------------------------------------------------------
# every stack: threads get the single-threaded results, bit for bit
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", STACKS)
def test_op_chains_in_threads_match_one_thread(spec: str) -> None:
    dev = _device(spec)
    n_threads, iters = 4, (20 if spec == "opencl" else 60) * SCALE  # OpenCL on a CPU driver is slower per op
    inputs = [_inputs(k) for k in range(n_threads)]
    want = [_chain(dev, *inputs[k]) for k in range(n_threads)]  # single-threaded reference (also warms caches)

    def work(k: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(iters):
                j = (k + i) % n_threads  # threads run each other's inputs too: plans and kernels are shared
                for r, (got, exp) in enumerate(zip(_chain(dev, *inputs[j]), want[j])):
                    assert np.array_equal(got, exp), f"{spec}: thread {k} iteration {i} result {r} differs"

        return run

    _run_threads([work(k) for k in range(n_threads)])


def test_all_stacks_at_once() -> None:
    # different stacks share process-wide machinery (numexpr's thread pool, the OpenCL queue, grad mode)
    specs = ["flex", "flex+fusion(enabled=False)", "flex+autodiff", "opencl"]
    try:
        ember.Device.parse("opencl")
    except EmberError:
        specs.pop()  # the flex stacks still share numexpr and grad mode
    devs = [ember.Device.parse(s) for s in specs]
    x_np, w_np = _inputs(0)
    want = [_chain(d, x_np, w_np) for d in devs]

    def work(k: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(40 * SCALE):
                d = (k + i) % len(devs)
                for got, exp in zip(_chain(devs[d], x_np, w_np), want[d]):
                    assert np.array_equal(got, exp), f"{specs[d]}: thread {k} iteration {i} differs"

        return run

    _run_threads([work(k) for k in range(2 * len(devs))])


@pytest.mark.parametrize("spec", ["flex", "flex+fusion(max_pending=3)", "opencl"])
def test_pending_tensors_handed_to_other_threads(spec: str) -> None:
    # a producer records chains and hands the results over unrealized while it keeps recording (and flushing);
    # consumers realize them: two threads must never realize one pending value at once
    dev = _device(spec)
    base = np.random.default_rng(0).standard_normal((256, 48)).astype("f4")
    x = ember.tensor(base, device=dev)

    def make(i: int) -> tuple[ember.Tensor, ember.Tensor]:
        y = x * float(i % 7 + 1) - .5
        return (y * 2 + x.abs()).sum(1), y

    want = {i: (make(i)[0].numpy(), make(i)[1].numpy()) for i in range(7)}
    q: queue.Queue[Any] = queue.Queue(maxsize=8)
    n = (200 if spec == "opencl" else 600) * SCALE

    def produce() -> None:
        try:
            for i in range(n):
                z, y = make(i)
                q.put((i, z, y))
                (y + 1).exp()  # more pending work in this thread, sharing y with a consumer
        finally:
            for _ in range(2):
                q.put(None)

    def consume() -> None:
        while (item := q.get()) is not None:
            i, z, y = item
            assert np.array_equal(z.numpy(), want[i % 7][0]), f"{spec}: item {i}"
            assert np.array_equal(y.numpy(), want[i % 7][1]), f"{spec}: item {i}"

    _run_threads([produce, consume, consume], switch_interval=1e-5)


@pytest.mark.parametrize("spec", TRAIN_STACKS)
def test_training_beside_no_grad_inference_matches_training_alone(spec: str) -> None:
    # inference threads only read the parameters, so the trainer's result is the one it gets alone, bit for bit
    dev = _device(spec)
    rng = np.random.default_rng(1)
    x = ember.tensor(rng.standard_normal((24, 6)).astype("f4"), device=dev)
    y = ember.tensor(rng.standard_normal((24, 3)).astype("f4"), device=dev)
    ember.manual_seed(0)
    init = {k: v.numpy().copy() for k, v in nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
            .state_dict().items()}
    steps = (25 if spec.startswith("opencl") else 60) * SCALE

    def fresh() -> tuple[nn.Module, Any]:
        m = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
        m.load_state_dict({k: ember.tensor(v) for k, v in init.items()})
        m = m.to(dev)
        return m, ember.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    def train(model: nn.Module, opt: Any, losses: list[float]) -> None:
        for i in range(steps):
            assert ember.is_grad_enabled(), f"step {i}: grad mode off in the training thread"
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            assert all(p.grad is not None for p in model.parameters()), f"step {i}: a parameter got no grad"
            opt.step()
            losses.append(loss.item())

    alone_model, alone_opt = fresh()
    alone: list[float] = []
    train(alone_model, alone_opt, alone)

    model, opt = fresh()
    losses: list[float] = []
    stop = threading.Event()

    def trainer() -> None:
        try:
            train(model, opt, losses)
        finally:
            stop.set()

    def infer() -> None:
        while not stop.is_set():
            with ember.no_grad():
                out = model(x)
                assert out.requires_grad is False
                out.numpy()

    _run_threads([trainer, infer, infer])
    assert losses == alone
    assert losses[-1] < losses[0]
    for (k, a), b in zip(model.state_dict().items(), alone_model.state_dict().values()):
        assert np.array_equal(a.numpy(), b.numpy()), k
    assert ember.is_grad_enabled()


def test_dataloader_workers_run_ember_ops() -> None:
    from ember_train.data import DataLoader, Dataset

    dev = _device("flex")
    base = np.random.default_rng(0).standard_normal((96, 16, 32)).astype("f4")

    class EmberOps(Dataset):
        def __len__(self) -> int:
            return len(base)

        def __getitem__(self, i: int) -> Any:
            x = ember.tensor(base[i], device=dev)
            return (F.relu(x * 0.5 - 0.1) + x.abs()).sum(1), i

    ref = list(DataLoader(EmberOps(), batch_size=8, num_workers=0, device=dev))
    for epoch in range(4 * SCALE):
        batches = list(DataLoader(EmberOps(), batch_size=8, num_workers=2, device=dev))
        assert len(batches) == len(ref)
        for (xb, ib), (xr, ir) in zip(batches, ref):
            assert np.array_equal(ib.numpy(), ir.numpy())
            assert np.array_equal(xb.numpy(), xr.numpy()), f"epoch {epoch}"


# ----------------------------------------------------------------------------------------------------------------
# per-thread modes and shared state
# ----------------------------------------------------------------------------------------------------------------
def test_grad_mode_is_per_thread() -> None:
    seen: dict[str, bool] = {}
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        seen["start"] = ember.is_grad_enabled()  # a new thread starts with grad on, whatever the main thread does
        with ember.no_grad():
            entered.set()
            release.wait(10)
            seen["inside"] = ember.is_grad_enabled()
        ember.set_grad_enabled(False)  # left off when the thread ends: affects no other thread
        seen["end"] = ember.is_grad_enabled()

    with ember.no_grad():
        t = threading.Thread(target=other)
        t.start()
        entered.wait(10)
        with ember.enable_grad():
            assert ember.is_grad_enabled()
        assert not ember.is_grad_enabled()
        release.set()
        t.join(10)
    assert ember.is_grad_enabled()
    assert seen == {"start": True, "inside": False, "end": False}

    dev = _device("flex+autodiff")
    w = ember.ones(3, device=dev, requires_grad=True)
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append((w * 2).requires_grad))
    with ember.no_grad():
        t.start()
        t.join(10)
        assert (w * 2).requires_grad is False
    assert out == [True]


@pytest.mark.parametrize("spec", ["flex+autodiff", "flex+fusion(enabled=False)+autodiff"])
def test_concurrent_backward_accumulates_every_gradient(spec: str) -> None:
    dev = _device(spec)
    w = ember.ones(5, device=dev, requires_grad=True)
    c = ember.tensor([1.0, 2.0, 3.0, 4.0, 0.5], device=dev)
    n_threads, iters = 4, 400 * SCALE

    def work() -> None:
        for _ in range(iters):
            (w * c).sum().backward()

    _run_threads([work] * n_threads, switch_interval=1e-5)
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), c.numpy() * (n_threads * iters))


def test_fusion_counters_are_exact_under_threads() -> None:
    dev = _device("flex+fusion(max_pending=64)")
    x = ember.tensor(np.ones((4, 4), "f4"), device=dev)

    def step() -> None:
        ((x * 2.0 + 1.0).exp() - x).numpy()

    def recorded() -> int:
        return int(dev.memory_report()["fusion_recorded"])

    before = recorded()
    step()
    per_step = recorded() - before
    assert per_step >= 4
    n_threads, iters = 4, 300 * SCALE
    before = recorded()
    _run_threads([lambda: [step() for _ in range(iters)]] * n_threads, switch_interval=1e-5)
    assert recorded() - before == per_step * n_threads * iters


def test_opencl_random_draws_in_threads_are_distinct() -> None:
    dev = _device("opencl")
    draws: list[np.ndarray] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [ember.rand(64, device=dev).numpy() for _ in range(100 * SCALE)]
        with lock:
            draws.extend(mine)

    _run_threads([work] * 4)
    distinct = {d.tobytes() for d in draws}
    assert len(distinct) == len(draws)  # two threads never got the same stream offset
