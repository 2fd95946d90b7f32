"""ember.autocast and ember.amp.GradScaler against torch.autocast("cpu") and torch.amp.GradScaler (the oracle).

Output dtypes of every op with an autocast rule match torch's CPU autocast, values agree at bfloat16 tolerance,
gradients reach float32 parameters in float32, and the state nests, stays per thread and works as a decorator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import Device
from ember.amp import GradScaler
from ember.errors import AutodiffError, DTypeError, UnsupportedError

torch = pytest.importorskip("torch")
TF = torch.nn.functional

DEV = Device.flex().autodiff()
_T2E = {torch.float32: ember.float32, torch.bfloat16: ember.bfloat16, torch.float16: ember.float16,
        torch.float64: ember.float64, torch.int64: ember.int64}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _arrays(*shapes: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    r = _rng(seed)
    return [r.standard_normal(s).astype(np.float32) for s in shapes]


def _pair(arrs: list[np.ndarray]) -> tuple[list[Any], list[Any]]:
    return [ember.tensor(a, device=DEV) for a in arrs], [torch.tensor(a) for a in arrs]


_LABELS = np.array([0, 2, 1])
_PROBS = (1 / (1 + np.exp(-_arrays((3, 4), seed=5)[0]))).astype(np.float32)

# name -> (input shapes, ember op, torch op); every op takes the float32 arrays in order
CASES: dict[str, tuple[list[tuple[int, ...]], Callable[..., Any], Callable[..., Any]]] = {
    "matmul": ([(3, 4), (4, 5)], lambda a, b: a @ b, lambda a, b: a @ b),
    "mm": ([(3, 4), (4, 5)], lambda a, b: ember.mm(a, b), torch.mm),
    "bmm": ([(2, 3, 4), (2, 4, 5)], lambda a, b: ember.bmm(a, b), torch.bmm),
    "mv": ([(3, 4), (4,)], lambda a, b: ember.mv(a, b), torch.mv),
    "dot": ([(4,), (4,)], lambda a, b: ember.dot(a, b), torch.dot),
    "einsum": ([(3, 4), (4, 5)], lambda a, b: ember.einsum("ij,jk->ik", a, b),
               lambda a, b: torch.einsum("ij,jk->ik", a, b)),
    "linear": ([(3, 4), (5, 4), (5,)], F.linear, TF.linear),
    "bilinear": ([(3, 4), (3, 2), (5, 4, 2)], F.bilinear, TF.bilinear),
    "conv1d": ([(2, 3, 8), (4, 3, 3)], F.conv1d, TF.conv1d),
    "conv2d": ([(2, 3, 6, 6), (4, 3, 3, 3), (4,)], F.conv2d, TF.conv2d),
    "conv3d": ([(1, 2, 4, 4, 4), (3, 2, 2, 2, 2)], F.conv3d, TF.conv3d),
    "conv_transpose1d": ([(2, 3, 5), (3, 4, 3)], F.conv_transpose1d, TF.conv_transpose1d),
    "conv_transpose2d": ([(2, 3, 4, 4), (3, 2, 3, 3)], F.conv_transpose2d, TF.conv_transpose2d),
    "conv_transpose3d": ([(1, 2, 3, 3, 3), (2, 2, 2, 2, 2)], F.conv_transpose3d, TF.conv_transpose3d),
    "prelu": ([(3, 4), (1,)], F.prelu, TF.prelu),
    "scaled_dot_product_attention": ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], F.scaled_dot_product_attention,
                                     TF.scaled_dot_product_attention),
    "softmax": ([(3, 4)], lambda x: F.softmax(x, -1), lambda x: TF.softmax(x, -1)),
    "log_softmax": ([(3, 4)], lambda x: F.log_softmax(x, -1), lambda x: TF.log_softmax(x, -1)),
    "layer_norm": ([(3, 4), (4,), (4,)], lambda x, w, b: F.layer_norm(x, (4,), w, b),
                   lambda x, w, b: TF.layer_norm(x, (4,), w, b)),
    "group_norm": ([(2, 4, 3)], lambda x: F.group_norm(x, 2), lambda x: TF.group_norm(x, 2)),
    "mse_loss": ([(3, 4), (3, 4)], F.mse_loss, TF.mse_loss),
    "l1_loss": ([(3, 4), (3, 4)], F.l1_loss, TF.l1_loss),
    "smooth_l1_loss": ([(3, 4), (3, 4)], F.smooth_l1_loss, TF.smooth_l1_loss),
    "huber_loss": ([(3, 4), (3, 4)], F.huber_loss, TF.huber_loss),
    "kl_div": ([(3, 4), (3, 4)], lambda a, b: F.kl_div(a, b, reduction="batchmean"),
               lambda a, b: TF.kl_div(a, b, reduction="batchmean")),
    "cross_entropy": ([(3, 4)], lambda x: F.cross_entropy(x, ember.tensor(_LABELS, device=DEV)),
                      lambda x: TF.cross_entropy(x, torch.tensor(_LABELS))),
    "nll_loss": ([(3, 4)], lambda x: F.nll_loss(x, ember.tensor(_LABELS, device=DEV)),
                 lambda x: TF.nll_loss(x, torch.tensor(_LABELS))),
    "binary_cross_entropy_with_logits": ([(3, 4)],
                                         lambda x: F.binary_cross_entropy_with_logits(
                                             x, ember.tensor(_PROBS, device=DEV)),
                                         lambda x: TF.binary_cross_entropy_with_logits(x, torch.tensor(_PROBS))),
    "cosine_similarity": ([(3, 4), (3, 4)], F.cosine_similarity, TF.cosine_similarity),
    "avg_pool3d": ([(1, 2, 4, 4, 4)], lambda x: F.avg_pool3d(x, 2), lambda x: TF.avg_pool3d(x, 2)),
    "max_pool3d": ([(1, 2, 4, 4, 4)], lambda x: F.max_pool3d(x, 2), lambda x: TF.max_pool3d(x, 2)),
    "adaptive_avg_pool3d": ([(1, 2, 4, 4, 4)], lambda x: F.adaptive_avg_pool3d(x, 1),
                            lambda x: TF.adaptive_avg_pool3d(x, 1)),
    "avg_pool2d": ([(1, 2, 4, 4)], lambda x: F.avg_pool2d(x, 2), lambda x: TF.avg_pool2d(x, 2)),
    "pad_replicate": ([(1, 2, 4, 4)], lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate"),
                      lambda x: TF.pad(x, (1, 1, 1, 1), mode="replicate")),
    "pad_reflect": ([(1, 2, 4, 4)], lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"),
                    lambda x: TF.pad(x, (1, 1, 1, 1), mode="reflect")),
    "pad_constant": ([(1, 2, 4, 4)], lambda x: F.pad(x, (1, 1)), lambda x: TF.pad(x, (1, 1))),
    "relu": ([(3, 4)], F.relu, TF.relu),
}


@pytest.mark.parametrize("input_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_output_dtype_and_values_match_torch_cpu_autocast(name: str, input_dtype: str) -> None:
    shapes, e_op, t_op = CASES[name]
    arrs = _arrays(*shapes, seed=len(name))
    ein, tin = _pair(arrs)
    if input_dtype == "bfloat16":  # a first input that an earlier autocast op already made bfloat16
        ein[0], tin[0] = ein[0].to(ember.bfloat16), tin[0].to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        try:
            want = t_op(*tin)
        except RuntimeError:
            want = None  # torch refuses the mixed dtypes even under autocast
    with ember.autocast("cpu"):
        if want is None:
            try:
                got = e_op(*ein)
            except ember.EmberError:
                return
            # ember runs such an op at the widest input dtype ("promote"); torch's own result must be float32
            assert got.dtype is ember.float32, name
            return
        got = e_op(*ein)
    assert got.dtype is _T2E[want.dtype], (name, got.dtype, want.dtype)
    g = got.float().numpy()
    w = want.float().detach().numpy()
    # torch's bilinear is a composition whose inner matmul autocasts to bfloat16; ember's runs at float32
    lower = ember.bfloat16 in (got.dtype, ein[0].dtype) or want.dtype == torch.bfloat16 or name == "bilinear"
    tol = 3e-2 if lower else 1e-5
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max(initial=0.0))))


def test_float64_inputs_are_left_alone() -> None:
    a = ember.randn(3, 4, dtype=ember.float64, device=DEV)
    with ember.autocast("cpu"):
        assert (a @ a.T).dtype is ember.float64
        assert F.mse_loss(a, a).dtype is ember.float64


def test_gradients_reach_float32_parameters_in_float32_and_match_torch() -> None:
    xa, wa, ba, ca = _arrays((4, 3, 6, 6), (5, 3, 3, 3), (5,), (2, 5 * 16), seed=3)
    ex, ew, eb, ec = (ember.tensor(a, device=DEV) for a in (xa, wa, ba, ca))
    for p in (ew, eb, ec):
        p.requires_grad_()
    tx, tw, tb, tc = (torch.tensor(a, requires_grad=i > 0) for i, a in enumerate((xa, wa, ba, ca)))
    labels = np.array([0, 1, 1, 0])
    with ember.autocast("cpu"):
        h = F.relu(F.conv2d(ex, ew, eb))
        out = F.linear(h.reshape(4, -1), ec)
        assert out.dtype is ember.bfloat16
        loss = F.cross_entropy(out, ember.tensor(labels, device=DEV))
    assert loss.dtype is ember.float32
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        th = TF.relu(TF.conv2d(tx, tw, tb))
        tloss = TF.cross_entropy(TF.linear(th.reshape(4, -1), tc), torch.tensor(labels))
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=2e-2)
    for e, t in ((ew, tw), (eb, tb), (ec, tc)):
        assert e.grad.dtype is ember.float32
        g, w = e.grad.numpy(), t.grad.numpy()
        np.testing.assert_allclose(g, w, rtol=5e-2, atol=5e-2 * float(np.abs(w).max()))


def test_modules_run_under_autocast() -> None:
    ember.manual_seed(0)
    model = ember.nn.Sequential(ember.nn.Linear(4, 8), ember.nn.LayerNorm(8), ember.nn.ReLU(),
                                ember.nn.Linear(8, 2)).to(DEV)
    x = ember.randn(5, 4, device=DEV)
    with ember.autocast("cpu"):
        y = model(x)
        assert y.dtype is ember.bfloat16
        loss = F.cross_entropy(y, ember.tensor([0, 1, 0, 1, 1], device=DEV))
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype is ember.float32 for p in model.parameters())


def test_nesting_enabled_false_and_dtype_override() -> None:
    a = ember.randn(3, 3, device=DEV)
    assert not ember.is_autocast_enabled("cpu")
    with ember.autocast("cpu"):
        assert ember.is_autocast_enabled("cpu") and ember.is_autocast_enabled()
        with ember.autocast("cpu", enabled=False):
            assert not ember.is_autocast_enabled("cpu")
            assert (a @ a).dtype is ember.float32
        with ember.autocast("cpu", dtype=ember.float16):
            assert ember.get_autocast_dtype("cpu") is ember.float16
            assert (a @ a).dtype is ember.float16
        assert (a @ a).dtype is ember.bfloat16
    assert not ember.is_autocast_enabled("cpu")
    assert (a @ a).dtype is ember.float32


def test_an_exception_inside_restores_the_state() -> None:
    with pytest.raises(KeyError):
        with ember.autocast("cpu"):
            raise KeyError("boom")
    assert not ember.is_autocast_enabled("cpu")


def test_one_instance_can_be_reused_and_nested() -> None:
    ac = ember.autocast("cpu")
    a = ember.randn(2, 2, device=DEV)
    with ac:
        with ac:
            assert (a @ a).dtype is ember.bfloat16
        assert ember.is_autocast_enabled("cpu")
    assert not ember.is_autocast_enabled("cpu")


def test_decorator_form() -> None:
    a = ember.randn(2, 2, device=DEV)

    @ember.autocast("cpu")
    def f(x: ember.Tensor) -> ember.Tensor:
        assert ember.is_autocast_enabled("cpu")
        return x @ x

    @ember.amp.autocast(device_type="cpu", enabled=False)
    def g(x: ember.Tensor) -> ember.Tensor:
        return x @ x

    assert f(a).dtype is ember.bfloat16 and f.__name__ == "f"
    assert not ember.is_autocast_enabled("cpu")
    with ember.autocast("cpu"):
        assert g(a).dtype is ember.float32
        assert (a @ a).dtype is ember.bfloat16


def test_state_is_per_thread() -> None:
    a = ember.randn(2, 2, device=DEV)
    seen: dict[str, Any] = {}

    def worker() -> None:
        seen["enabled"] = ember.is_autocast_enabled("cpu")
        seen["dtype"] = (a @ a).dtype
        with ember.autocast("cpu", dtype=ember.float16):
            seen["inner"] = (a @ a).dtype

    with ember.autocast("cpu"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert (a @ a).dtype is ember.bfloat16  # the thread's own autocast did not leak here
    assert seen == {"enabled": False, "dtype": ember.float32, "inner": ember.float16}


def test_autocast_applies_only_to_its_backend_kind() -> None:
    if "toy" not in ember.plugins.manager.registry.ensure_loaded().backends:
        pytest.skip("the example backend (toy) is not installed")
    t = ember.randn(2, 2, device="toy")
    with ember.autocast("cpu"):
        assert (t @ t).dtype is ember.float32
    with ember.autocast("toy"):
        assert (t @ t).dtype is ember.bfloat16
        assert (ember.randn(2, 2, device=DEV) @ ember.randn(2, 2, device=DEV)).dtype is ember.float32


def test_parameter_casts_are_cached_per_region() -> None:
    w = ember.randn(3, 3, device=DEV).requires_grad_()
    x = ember.randn(2, 3, device=DEV)
    with ember.autocast("cpu"):
        F.linear(x, w)
        cached = ember.amp.autocast_mode.STATE.cache[id(w)][1]
        F.linear(x, w)
        assert ember.amp.autocast_mode.STATE.cache[id(w)][1] is cached
    assert not ember.amp.autocast_mode.STATE.cache
    with ember.autocast("cpu", cache_enabled=False):
        F.linear(x, w)
        assert not ember.amp.autocast_mode.STATE.cache


def test_bad_dtype_and_unsupported_device_are_typed_errors() -> None:
    with pytest.raises(DTypeError, match="bfloat16 or float16.*float64"):
        ember.autocast("cpu", dtype=ember.float64)
    with pytest.raises(DTypeError, match="device_type"):
        ember.autocast(3)
    if "nosuchkind" not in ember.plugins.manager.registry.ensure_loaded().backends:
        with pytest.raises(ember.DeviceError, match="autocast: device_type 'nosuchkind' is not usable here.*'cpu'"):
            ember.autocast("nosuchkind")
    ember.autocast("cpu", dtype=ember.float64, enabled=False)  # disabled: nothing to check


@pytest.fixture
def narrow_backend() -> Any:
    """A backend 'nobf16' (flex's factory, without bfloat16) declaring PyTorch's GPU autocast lists and float16."""
    from ember.plugins import CONTRACT_VERSION, hookimpl, manager

    reg = manager.registry.ensure_loaded()
    flex_factory = reg.backends["flex"].factory

    def factory(index: int = 0) -> Any:
        b = flex_factory(index)
        b.supported_dtypes = frozenset(d for d in b.supported_dtypes if d is not ember.bfloat16)
        return b

    class Plugin:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            register("nobf16", factory, contract=CONTRACT_VERSION, kind="cpu", priority=-50)

        @hookimpl
        def register_backend_traits(self, register: Any) -> None:
            register("nobf16", autocast_dtype=ember.float16, autocast_ops="gpu")

    plugin = Plugin()
    reg.register_plugin(plugin, "nobf16-test")
    yield Device("nobf16", 0)
    reg._manager().unregister(plugin)
    reg.backends.pop("nobf16", None)
    reg.plugins[:] = [p for p in reg.plugins if p.name != "nobf16-test"]


def test_a_dtype_the_backend_lacks_is_refused_naming_device_and_dtypes(narrow_backend: Device) -> None:
    with pytest.raises(UnsupportedError, match=r"device nobf16 does not support dtype bfloat16 \(its floating "
                                               r"dtypes: float16, float32, float64\); pass dtype=ember.float16"):
        ember.autocast("nobf16", dtype=ember.bfloat16)


def test_declared_gpu_lists_follow_torch_cuda_autocast(narrow_backend: Device) -> None:
    """The GPU table (torch.autocast("cuda")): float16 by default, softmax/layer_norm in float32, bce banned."""
    a = ember.randn(3, 4, device=narrow_backend)
    w = ember.randn(5, 4, device=narrow_backend)
    with ember.autocast("nobf16"):
        assert ember.get_autocast_dtype("nobf16") is ember.float16
        y = F.linear(a, w)
        assert y.dtype is ember.float16
        assert ember.mv(a, a[0]).dtype is ember.float16
        assert F.softmax(y, -1).dtype is ember.float32
        assert F.layer_norm(y, (5,)).dtype is ember.float32
        assert F.batch_norm(y, None, None, training=True).dtype is ember.float16
        with pytest.raises(UnsupportedError, match="binary_cross_entropy.*with_logits"):
            F.binary_cross_entropy(F.sigmoid(y), F.sigmoid(y))
        assert F.binary_cross_entropy_with_logits(y, F.sigmoid(y)).dtype is ember.float32


# -- GradScaler -------------------------------------------------------------------------------------------------------
def _model_pair(seed: int) -> tuple[Any, Any]:
    r = _rng(seed)
    w1, b1, w2, b2 = (r.standard_normal(s).astype(np.float32) * 0.5 for s in ((8, 4), (8,), (3, 8), (3,)))
    em = ember.nn.Sequential(ember.nn.Linear(4, 8), ember.nn.Tanh(), ember.nn.Linear(8, 3)).to(DEV)
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with ember.no_grad(), torch.no_grad():
        for (ep, tp), v in zip(zip(em.parameters(), tm.parameters()), (w1, b1, w2, b2)):
            ep.copy_(ember.tensor(v, device=DEV))
            tp.copy_(torch.tensor(v))
    return em, tm


def test_grad_scaler_matches_torch_including_skipped_steps() -> None:
    em, tm = _model_pair(1)
    eopt = ember.optim.SGD(em.parameters(), lr=0.1)
    topt = torch.optim.SGD(tm.parameters(), lr=0.1)
    es = GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    ts = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    r = _rng(2)
    for step in range(7):
        x = r.standard_normal((6, 4)).astype(np.float32)
        y = r.integers(0, 3, 6)
        if step == 3:
            x[0, 0] = np.inf  # an overflowing step: skipped, scale backs off
        eopt.zero_grad()
        topt.zero_grad()
        eloss = F.cross_entropy(em(ember.tensor(x, device=DEV)), ember.tensor(y, device=DEV))
        tloss = TF.cross_entropy(tm(torch.tensor(x)), torch.tensor(y))
        es.scale(eloss).backward()
        ts.scale(tloss).backward()
        if step == 5:  # unscale_ first (gradient clipping's place), then step does not unscale again
            es.unscale_(eopt)
            ts.unscale_(topt)
        es.step(eopt)
        ts.step(topt)
        es.update()
        ts.update()
        assert es.get_scale() == ts.get_scale(), step
        assert es.state_dict() == {k: (v.item() if hasattr(v, "item") else v) for k, v in ts.state_dict().items()}
        for ep, tp in zip(em.parameters(), tm.parameters()):
            np.testing.assert_allclose(ep.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_grad_scaler_misuse_and_disabled() -> None:
    em, _ = _model_pair(3)
    opt = ember.optim.SGD(em.parameters(), lr=0.1)
    s = GradScaler("cpu")
    with pytest.raises(AutodiffError, match="scale"):
        s.step(opt)
    loss = em(ember.randn(2, 4, device=DEV)).sum()
    scaled = s.scale(loss)
    assert scaled.item() == pytest.approx(loss.item() * 65536.0, rel=1e-5)
    scaled.backward()
    s.unscale_(opt)
    with pytest.raises(AutodiffError, match="already been called"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(AutodiffError, match="step"):
        s.step(opt)
    s.update()
    off = GradScaler(enabled=False)
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}
    with pytest.raises(DTypeError):
        s.scale(3.0)
    with pytest.raises(ember.ValueRangeError, match="growth_factor"):
        GradScaler(growth_factor=1.0)


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_with_lower_precision_input_updates_float32_running_stats_like_torch(affine: bool) -> None:
    x = _arrays((4, 3, 5), seed=7)[0]
    em = ember.nn.BatchNorm1d(3, affine=affine)
    tm = torch.nn.BatchNorm1d(3, affine=affine)
    with ember.autocast("cpu"), torch.autocast("cpu", dtype=torch.bfloat16):
        e = em(ember.tensor(x).bfloat16())
        t = tm(torch.tensor(x).bfloat16())
    assert e.dtype is ember.bfloat16 and t.dtype == torch.bfloat16
    np.testing.assert_allclose(e.float().numpy(), t.float().detach().numpy(), atol=2e-2)
    assert em.running_mean.dtype is ember.float32  # updated in place, never replaced by a cast copy
    np.testing.assert_allclose(em.running_mean.numpy(), tm.running_mean.numpy(), atol=1e-2)
    np.testing.assert_allclose(em.running_var.numpy(), tm.running_var.numpy(), atol=1e-2)


def test_one_instance_entered_in_two_threads_at_once() -> None:
    ac = ember.autocast("cpu")
    a = ember.randn(2, 2, device=DEV)
    barrier = threading.Barrier(2)
    seen: list[Any] = []

    def worker() -> None:
        with ac:
            barrier.wait()  # both threads are inside the same instance now
            seen.append((a @ a).dtype)
            barrier.wait()
        seen.append(ember.is_autocast_enabled("cpu"))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(str, seen)) == sorted(["False", "False", str(ember.bfloat16), str(ember.bfloat16)])
    assert not ember.is_autocast_enabled("cpu")


def _installed_kinds() -> list[str]:
    return sorted(ember.plugins.manager.registry.ensure_loaded().backends)


@pytest.mark.parametrize("kind", _installed_kinds())
def test_every_installed_backend_autocasts_like_torch(kind: str) -> None:
    """Each backend's declared (or kind-derived) policy: the dtypes of a conv + loss step, float32 gradients where the
    device records them, and values next to torch's autocast of the same policy."""
    try:
        dev = Device.parse(kind)
        ember.zeros(1, device=dev)
    except ember.EmberError as exc:
        pytest.skip(f"no {kind} device here: {exc}")
    if ember.plugins.manager.registry.differentiable_decorator() is not None:
        dev = dev.autodiff()
    dtype = ember.get_autocast_dtype(kind)
    xa, wa = _arrays((2, 3, 6, 6), (4, 3, 3, 3), seed=11)
    x = ember.tensor(xa, device=dev)
    w = ember.tensor(wa, device=dev).requires_grad_()
    with ember.autocast(kind):
        y = F.conv2d(x, w)
        loss = F.mse_loss(y, ember.zeros(y.shape, device=dev))
    assert y.dtype is dtype and loss.dtype is ember.float32
    tdtype = {ember.bfloat16: torch.bfloat16, ember.float16: torch.float16}[dtype]
    with torch.autocast("cpu", dtype=tdtype):
        ty = TF.conv2d(torch.tensor(xa), torch.tensor(wa))
    want = ty.float().numpy()
    np.testing.assert_allclose(y.float().numpy(), want, rtol=3e-2, atol=3e-2 * float(np.abs(want).max()))
    if dev.stack.differentiable:
        loss.backward()
        assert w.grad.dtype is ember.float32


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"])
@pytest.mark.parametrize("input_dtype", ["float32", "bfloat16"])
def test_recurrent_layers_follow_torch_cpu_autocast(kind: str, input_dtype: str) -> None:
    """nn.LSTM and plain RNNs run in bfloat16 under CPU autocast, GRU in its input's dtype; the values agree with
    torch's at bfloat16 tolerance and the float32 parameters get float32 gradients."""
    make = {"LSTM": lambda m: m.LSTM(4, 3), "GRU": lambda m: m.GRU(4, 3), "RNN_TANH": lambda m: m.RNN(4, 3),
            "RNN_RELU": lambda m: m.RNN(4, 3, nonlinearity="relu")}[kind]
    ref = make(torch.nn)
    mod = make(ember.nn).to(DEV)
    mod.load_state_dict({k: ember.tensor(v.detach().numpy(), device=DEV) for k, v in ref.state_dict().items()})
    (x,) = _arrays((5, 2, 4), seed=3)
    tx, ex = torch.tensor(x).to(getattr(torch, input_dtype)), ember.tensor(x, device=DEV).to(input_dtype)
    with torch.autocast("cpu"):
        want = ref(tx)[0]
    with ember.autocast("cpu"):
        got = mod(ex)[0]
    assert got.dtype == _T2E[want.dtype]
    np.testing.assert_allclose(got.float().numpy(), want.float().detach().numpy(), rtol=5e-2, atol=5e-2)
    got.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == ember.float32 for p in mod.parameters())


def test_a_backend_without_bfloat16_autocasts_to_float16_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU-kind backend that lacks bfloat16 (WebGPU on lavapipe) gets float16, the dtype it has, not an error."""
    dev = Device.flex()
    stack = dev.stack
    monkeypatch.setattr(stack, "supported_dtypes", frozenset(d for d in stack.supported_dtypes
                                                             if d is not ember.bfloat16))
    assert ember.get_autocast_dtype(dev) is ember.float16
    with ember.autocast(dev):
        y = ember.ones(2, 3, device=dev) @ ember.ones(3, 2, device=dev)
    assert y.dtype is ember.float16
    monkeypatch.undo()
    assert ember.get_autocast_dtype(dev) is ember.bfloat16
