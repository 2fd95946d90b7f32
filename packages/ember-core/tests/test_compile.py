"""ember.compile: whole-step capture and replay, bit for bit as eager on flex; guards, graph breaks, bindings."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import ember
from ember import nn
from ember.errors import DTypeError, ValueRangeError

AD = ember.Device.flex().autodiff()


def _batches(n: int, shape: tuple[int, ...], classes: int, seed: int = 0) -> list[tuple[ember.Tensor, ember.Tensor]]:
    rng = np.random.default_rng(seed)
    return [(ember.tensor(rng.standard_normal(shape).astype(np.float32), device=AD),
             ember.tensor(rng.integers(0, classes, shape[0]), device=AD)) for _ in range(n)]


class _Net(nn.Module):
    """Conv + BatchNorm (train mode) + dropout on the device stream + linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        h = nn.functional.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(h.flatten(1)))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))


def _train(make_model, make_opt, batches, compiled: bool, sched: bool | str = False, seed: int = 0):
    """Run one training loop; returns (losses, parameters + buffers + optimizer state, compiled stats).
    ``sched``: True for StepLR (lr changes), ``"onecycle"`` for OneCycleLR (lr and Adam's beta1 change)."""
    ember.manual_seed(seed, AD)
    model = make_model().to(AD)
    model.train()
    opt = make_opt(model.parameters())
    if sched == "onecycle":
        scheduler = ember.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=len(batches))
    else:
        scheduler = ember.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if sched else None
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = ember.compile(step) if compiled else step
    AD.seed(7)
    losses = []
    for x, y in batches:
        losses.append(fn(x, y).numpy().copy())
        if scheduler is not None:
            scheduler.step()
    state = [t.numpy().copy() for t in (*model.parameters(), *model.buffers())]
    for s in opt.state.values():
        state += [v.numpy().copy() for _, v in sorted(s.items()) if isinstance(v, ember.Tensor)]
    return losses, state, (fn.stats() if compiled else None)


def _assert_same(a, b) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_mlp_adamw_scheduler_bit_identical():
    batches = _batches(6, (8, 6), 3)

    def opt(ps):
        return ember.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)

    la, sa, _ = _train(_mlp, opt, batches, compiled=False, sched=True)
    lb, sb, stats = _train(_mlp, opt, batches, compiled=True, sched=True)
    _assert_same(la, lb)
    _assert_same(sa, sb)
    # the first call creates Adam's state (a warm-up recording), the second records the steady step, the rest
    # replay although the scheduler changes lr every other step
    assert stats["replays"] == 4 and stats["graph_breaks"] == 0 and stats["graphs"] == 1


def test_onecycle_cycling_adams_momentum_replays_bit_identical():
    # OneCycleLR moves lr and betas[0] every step: both are bindings where Adam runs its fused kernel (flex)
    batches = _batches(7, (8, 6), 3)

    def opt(ps):
        return ember.optim.Adam(ps, lr=1e-2)

    la, sa, _ = _train(_mlp, opt, batches, compiled=False, sched="onecycle")
    lb, sb, stats = _train(_mlp, opt, batches, compiled=True, sched="onecycle")
    _assert_same(la, lb)
    _assert_same(sa, sb)
    assert stats["replays"] == 5 and stats["graph_breaks"] == 0 and stats["graphs"] == 1


def test_adam_binds_betas_only_where_every_parameter_runs_the_fused_kernel():
    p32 = ember.zeros(3, device=AD, requires_grad=True)
    assert ember.optim.Adam([p32])._compile_bindings == ("lr", "betas")
    p16 = ember.zeros(3, dtype=ember.float16, device=AD, requires_grad=True)  # no fused kernel: the composition
    assert ember.optim.Adam([p32, p16])._compile_bindings == ("lr",)


def test_batchnorm_dropout_sgd_bit_identical():
    batches = _batches(5, (6, 1, 6, 6), 3)

    def opt(ps):
        return ember.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)

    la, sa, _ = _train(_Net, opt, batches, compiled=False)
    lb, sb, stats = _train(_Net, opt, batches, compiled=True)
    _assert_same(la, lb)
    _assert_same(sa, sb)  # running statistics, num_batches_tracked and momentum buffers included
    assert stats["replays"] == 3


def test_guard_miss_records_again_on_a_new_shape():
    batches = _batches(3, (8, 6), 3) + _batches(2, (5, 6), 3, seed=1) + _batches(2, (8, 6), 3, seed=2)

    def opt(ps):
        return ember.optim.SGD(ps, lr=0.1)

    la, sa, _ = _train(_mlp, opt, batches, compiled=False)
    lb, sb, stats = _train(_mlp, opt, batches, compiled=True)
    _assert_same(la, lb)
    _assert_same(sa, sb)
    assert stats["graphs"] == 2 and stats["guard_misses"] == 1
    assert stats["replays"] == 5  # 2 of batch 8 + 1 of batch 5 + 2 of batch 8 again


def test_read_inside_the_step_is_a_graph_break_with_eager_results():
    ember.manual_seed(0, AD)
    w = ember.randn(4, 3, device=AD)

    def step(x):
        s = (x @ w).sum()
        return x * 2 if s.item() > 0 else x * 3  # a branch on a value: must never replay one branch for both

    fn = ember.compile(step)
    xs = [ember.full((2, 4), v, device=AD) for v in (1.0, -1.0, 1.0, -1.0)]
    out = [fn(x).numpy() for x in xs]
    for x, o in zip(xs, out):
        np.testing.assert_array_equal(o, step(x).numpy())
    stats = fn.stats()
    assert stats["replays"] == 0 and stats["graph_breaks"] == 1 and stats["eager_calls"] == 3
    assert "reads the value" in stats["reason"] and "step" in stats["reason"]
    with pytest.raises(ember.compile.CompileError, match="graph break"):
        ember.compile(step, fullgraph=True)(xs[0])


def test_generator_draws_are_a_graph_break():
    gen = ember.Generator(AD).manual_seed(3)

    def noisy(x):
        return x + ember.rand(x.shape, generator=gen, device=AD)

    fn = ember.compile(noisy)
    x = ember.zeros(3, 2, device=AD)
    first = [fn(x).numpy() for _ in range(3)]
    gen.manual_seed(3)
    _assert_same(first, [noisy(x).numpy() for _ in range(3)])
    assert fn.stats()["replays"] == 0 and "Generator" in fn.stats()["reason"]


def test_device_stream_draws_replay_like_eager():
    def noisy(x):
        return x * ember.rand(x.shape, device=AD) + ember.randn(x.shape, device=AD)

    fn = ember.compile(noisy)
    x = ember.ones(4, 3, device=AD)
    AD.seed(11)
    got = [fn(x).numpy() for _ in range(4)]
    AD.seed(11)
    _assert_same(got, [noisy(x).numpy() for _ in range(4)])
    assert fn.stats()["replays"] == 3


def test_state_replaced_outside_the_step_is_seen():
    ember.manual_seed(0, AD)
    lin = nn.Linear(3, 2).to(AD)

    @ember.compile
    def f(x):
        with ember.no_grad():
            return lin(x) * 2

    x = ember.ones(1, 3, device=AD)
    f(x), f(x), f(x)
    lin.load_state_dict({"weight": ember.zeros(2, 3, device=AD), "bias": ember.ones(2, device=AD)})
    lin.bias = nn.Parameter(ember.full((2,), 5.0, device=AD))  # a new tensor object: another guard value
    np.testing.assert_array_equal(f(x).numpy(), [[10.0, 10.0]])


def test_outputs_keep_their_structure_and_are_detached():
    ember.manual_seed(0, AD)
    w = nn.Parameter(ember.randn(3, device=AD))

    def f(x):
        y = (x * w).sum()
        y.backward()
        return {"loss": y.detach(), "pair": (x + 1, "tag"), "none": None}

    fn = ember.compile(f)
    x = ember.ones(3, device=AD)
    for _ in range(3):
        w.grad = None
        out = fn(x)
    assert fn.stats()["replays"] == 2
    assert set(out) == {"loss", "pair", "none"} and out["pair"][1] == "tag" and out["none"] is None
    np.testing.assert_array_equal(out["pair"][0].numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0, 1.0])  # the gradient the replay computed
    assert out["loss"].item() == pytest.approx(float(w.detach().sum().item()))


def test_gradients_accumulate_across_replays_like_eager():
    ember.manual_seed(0, AD)
    w = nn.Parameter(ember.randn(4, device=AD))

    def f(x):
        (x * w).pow(2).sum().backward()

    fn = ember.compile(f)
    x = ember.arange(4, dtype=ember.float32, device=AD)
    for _ in range(4):
        fn(x)
    expected = 4 * 2 * x.numpy() ** 2 * w.detach().numpy()
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6)
    assert fn.stats()["replays"] >= 2


def test_two_threads_each_with_their_own_compiled_step():
    batches = _batches(6, (8, 6), 3)

    def opt(ps):
        return ember.optim.Adam(ps, lr=1e-2)

    # dropout-free models (the device stream is shared by the threads); built here, one after the other
    expected_losses, expected_state, _ = _train(_mlp, opt, batches, compiled=False)
    steps = []
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(2):
        ember.manual_seed(0, AD)
        model = _mlp().to(AD)
        o = opt(model.parameters())

        def step(x, y, model=model, o=o, loss_fn=loss_fn):
            loss = loss_fn(model(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            return loss

        steps.append((model, o, ember.compile(step)))
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            model, o, fn = steps[k]
            losses = [fn(x, y).numpy().copy() for x, y in batches]
            state = [t.numpy().copy() for t in model.parameters()]
            for s in o.state.values():
                state += [v.numpy().copy() for _, v in sorted(s.items())]
            results[k] = (losses, state, fn.stats())
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    for k in range(2):
        losses, state, stats = results[k]
        assert stats["replays"] == 4
        _assert_same(losses, expected_losses)
        _assert_same(state, expected_state)


def test_replay_off_by_environment(monkeypatch):
    monkeypatch.setenv("EMBER_REPLAY", "0")
    fn = ember.compile(lambda x: x * 2)
    x = ember.ones(2, device=AD)
    for _ in range(3):
        np.testing.assert_array_equal(fn(x).numpy(), [2.0, 2.0])
    stats = fn.stats()
    assert stats["recordings"] == 0 and stats["eager_calls"] == 3 and stats["reason"] == "EMBER_REPLAY=0"


def test_recompile_limit_warns_and_runs_eagerly(caplog):
    fn = ember.compile(lambda x: (x * 2).sum())
    with caplog.at_level(logging.WARNING, logger="ember.compile"):
        for n in range(1, ember.compile.RECOMPILE_LIMIT + 3):
            assert fn(ember.ones(n, device=AD)).item() == 2 * n
    assert fn.stats()["graphs"] == ember.compile.RECOMPILE_LIMIT
    assert any("recompile limit" in r.message for r in caplog.records)


def test_decorator_forms_and_plain_device():
    dev = ember.Device.flex()

    @ember.compile
    def f(x):
        return (x + 1).relu()

    @ember.compile(fullgraph=True)
    def g(x):
        return x.exp().sum(0)

    x = ember.tensor(np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3), device=dev)
    for _ in range(3):
        np.testing.assert_array_equal(f(x).numpy(), np.maximum(x.numpy() + 1, 0))
        np.testing.assert_array_equal(g(x).numpy(), (x + 0).exp().sum(0).numpy())
    assert f.stats()["replays"] == 2 and g.stats()["replays"] == 2


def test_bad_arguments():
    with pytest.raises(DTypeError, match="callable"):
        ember.compile(3)
    with pytest.raises(ValueRangeError, match="dynamic"):
        ember.compile(lambda x: x, dynamic=True)
    with pytest.raises(ValueRangeError, match="mode"):
        ember.compile(lambda x: x, mode="max-autotune")
    with pytest.raises(DTypeError, match="fullgraph"):
        ember.compile(lambda x: x, fullgraph="yes")
    # no tensor argument: nothing to replay on, runs eagerly and says why
    fn = ember.compile(lambda n: n + 1)
    assert fn(2) == 3 and "tensor" in fn.stats()["reason"]


def test_state_the_compiled_function_cannot_see_is_a_graph_break():
    ember.manual_seed(0, AD)
    model = _mlp().to(AD)
    hidden = [[[ember.optim.Adam(model.parameters(), lr=1e-2)]]]  # deeper than the compiled function looks
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        opt = hidden[0][0][0]
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = ember.compile(step)
    batches = _batches(4, (8, 6), 3)
    got = [fn(x, y).numpy().copy() for x, y in batches]
    ember.manual_seed(0, AD)
    model2 = _mlp().to(AD)
    opt2 = ember.optim.Adam(model2.parameters(), lr=1e-2)
    want = []
    for x, y in batches:
        loss = loss_fn(model2(x), y)
        loss.backward()
        opt2.step()
        opt2.zero_grad()
        want.append(loss.numpy().copy())
    _assert_same(got, want)
    assert fn.stats()["replays"] == 0 and "kept outside" in fn.stats()["reason"]


def test_a_list_growing_every_call_runs_eagerly():
    history: list[ember.Tensor] = []

    def f(x):
        history.append(x * 2)
        return history[-1].sum()

    fn = ember.compile(f)
    for k in range(5):
        assert fn(ember.full((3,), float(k), device=AD)).item() == 6.0 * k
    assert len(history) == 5 and [h.numpy()[0] for h in history] == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert fn.stats()["replays"] == 0 and "kept outside" in fn.stats()["reason"]


def test_aliased_arguments_and_untouched_outputs():
    def f(a, b):
        return a * 2 + b, b

    fn = ember.compile(f)
    x = ember.ones(3, device=AD)
    for _ in range(3):
        out, same = fn(x, x)  # one tensor twice: one input
    np.testing.assert_array_equal(out.numpy(), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(same.numpy(), x.numpy())
    y = ember.full((3,), 5.0, device=AD)
    out, same = fn(x, y)  # two tensors: another guard value, not the aliased graph
    np.testing.assert_array_equal(out.numpy(), [7.0, 7.0, 7.0])
    np.testing.assert_array_equal(same.numpy(), [5.0, 5.0, 5.0])
    assert fn.stats()["graphs"] == 2

    w = ember.arange(3, dtype=ember.float32, device=AD)

    def g(x):
        return x + 1, w  # w is returned as it is: never touched by a kernel

    gn = ember.compile(g)
    for _ in range(3):
        _, ww = gn(x)
    assert isinstance(ww, ember.Tensor) and ww.tolist() == [0.0, 1.0, 2.0] and gn.stats()["replays"] == 2


def test_tensor_keyword_arguments_run_eagerly():
    fn = ember.compile(lambda x, *, scale: x * scale)
    x = ember.ones(2, device=AD)
    for v in (2.0, 3.0):
        np.testing.assert_array_equal(fn(x, scale=ember.full((2,), v, device=AD)).numpy(), [v, v])
    assert "keyword" in fn.stats()["reason"]
    # a Python keyword argument is a guard (compared by value)
    kn = ember.compile(lambda x, *, scale: x * scale)
    assert [kn(x, scale=s).tolist() for s in (2.0, 2.0, 2.0, 4.0)] == [[2.0, 2.0]] * 3 + [[4.0, 4.0]]
    assert kn.stats()["graphs"] == 2 and kn.stats()["replays"] == 2


def test_elementwise_runs_replay_as_fused_kernels():
    dev = ember.Device.flex()

    def f(x, y):
        h = ((x * 2 + 1).tanh() * y - 0.5).exp()
        return h.sum(1), ember.where(h > 1.0, h, x)

    fn = ember.compile(f)
    rng = np.random.default_rng(0)
    x, y = (ember.tensor(rng.standard_normal((64, 32)).astype(np.float32), device=dev) for _ in range(2))
    for _ in range(3):
        s, w = fn(x, y)
    es, ew = f(x, y)
    np.testing.assert_array_equal(s.numpy(), es.numpy())
    np.testing.assert_array_equal(w.numpy(), ew.numpy())
    stats = fn.stats()
    assert stats["replays"] == 2 and stats["kernels"] < stats["records"]  # the chain ran as one compiled kernel


def test_tensor_index_replays_negative_indices_the_recording_did_not_have() -> None:
    """x[idx] records the negative-index wrap whatever the recorded indices hold: a replay given negative ones
    wraps them (before, the recording's all-non-negative indices left the wrap out, so x[int tensor] was a break)."""
    x = ember.tensor(np.arange(15.0, dtype=np.float32).reshape(5, 3))
    step = ember.compile(lambda x, i: x[i] * 2)
    for idx in ([0, 1, 2], [3, 4, 0], [-1, -5, 2], [4, -2, 0]):
        got = step(x, ember.tensor(np.array(idx)))
        np.testing.assert_array_equal(got.numpy(), x.numpy()[idx] * 2)
    assert step.stats()["replays"] == 3 and step.stats()["graph_breaks"] == 0
    # the range check ran while recording; a replay's kernel refusing an index is still ember's typed error
    with pytest.raises(ember.IndexOutOfRangeError, match=r"ember.compile: a replayed kernel failed .*EMBER_REPLAY=0"):
        step(x, ember.tensor(np.array([5, 0, 0])))
    with pytest.raises(ember.IndexOutOfRangeError, match="index 5 is out of bounds for dimension 0 with size 5"):
        (lambda x, i: x[i] * 2)(x, ember.tensor(np.array([5, 0, 0])))  # eager: the check's own message
