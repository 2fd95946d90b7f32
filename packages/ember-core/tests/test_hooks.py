"""Module hooks (forward pre-hooks, forward hooks, full backward hooks and pre-hooks, the global
``register_module_*_hook``s) and ``ember.utils.hooks.RemovableHandle``, checked against PyTorch: the same code runs
on ``torch.nn`` and ``ember.nn`` (ember's weights copied from torch's) and the hooks' calls, the values they see and
the resulting gradients are compared."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.modules.module as torch_module_hooks

import ember
import ember.nn.modules.module as ember_module_hooks
from ember import Device, EmberError
from ember.nn import module as ember_nn_module
from ember.utils.hooks import RemovableHandle

AD = Device.flex().autodiff()
X = np.array([[0.5, -1.0, 2.0, 0.1], [1.5, 0.25, -0.75, -2.0], [0.3, 0.7, -0.2, 1.1]], dtype=np.float32)
LIBS = (("torch", torch), ("ember", ember))


def _np(t: Any) -> Any:
    if t is None:
        return None
    if isinstance(t, tuple):
        return tuple(_np(x) for x in t)
    return t.detach().numpy().copy() if isinstance(t, torch.Tensor) else t.numpy().copy()


def _input(lib: Any, a: np.ndarray = X, requires_grad: bool = True) -> Any:
    if lib is torch:
        return torch.tensor(a, requires_grad=requires_grad)
    return ember.tensor(a, device=AD).requires_grad_(requires_grad)


def _mlp(lib: Any) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    if lib is torch:
        return model
    nn = ember.nn
    em = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).to(AD)
    em.load_state_dict({k: ember.tensor(v.detach().numpy()) for k, v in model.state_dict().items()})
    return em


def _same(e: Any, t: Any, where: str) -> None:
    if isinstance(t, (tuple, list)):
        assert isinstance(e, (tuple, list)) and len(e) == len(t), (where, e, t)
        for i, (a, b) in enumerate(zip(e, t)):
            _same(a, b, f"{where}[{i}]")
    elif t is None or isinstance(t, (str, int, float)):
        assert e == t, (where, e, t)
    else:
        np.testing.assert_allclose(e, t, rtol=1e-5, atol=1e-6, err_msg=where)


def _compare(scenario: Callable[[Any, list[Any]], Any]) -> None:
    """Run ``scenario(lib, log)`` on torch and ember; the logs and the returned values must agree."""
    got = {}
    for name, lib in LIBS:
        log: list[Any] = []
        out = scenario(lib, log)
        got[name] = (log, out)
    _same(got["ember"][0], got["torch"][0], "log")
    _same(got["ember"][1], got["torch"][1], "result")


@pytest.fixture(autouse=True)
def _no_global_hooks_leak() -> Iterator[None]:
    yield
    for mod in (ember_nn_module, torch_module_hooks):
        for name in ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                     "_global_backward_hooks"):
            assert not getattr(mod, name), f"{mod.__name__}.{name} left registered by the test"


# ------------------------------------------------------------------------------------------------------------
# forward pre-hooks and forward hooks
# ------------------------------------------------------------------------------------------------------------
def test_forward_pre_hooks_replace_the_arguments_in_order() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        m = _mlp(lib)[0]
        m.register_forward_pre_hook(lambda mod, args: log.append(("second", _np(args))) or args[0] * 2)
        m.register_forward_pre_hook(lambda mod, args: log.append(("first", _np(args))), prepend=True)

        def with_kwargs(mod: Any, args: Any, kwargs: Any) -> Any:
            log.append(("kwargs", _np(args), sorted(kwargs)))
            return (args[0] + 1,), kwargs

        m.register_forward_pre_hook(with_kwargs, with_kwargs=True)
        m.register_forward_pre_hook(lambda mod, args: log.append(("last", _np(args))))
        return _np(m(_input(lib)))

    _compare(scenario)


def test_forward_hooks_see_args_and_kwargs_and_replace_the_output() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        nn = lib.nn

        class Scale(nn.Module):
            def forward(self, x: Any, *, factor: float = 1.0) -> Any:
                return x * factor

        m = Scale()
        m.register_forward_hook(lambda mod, args, out: log.append(("plain", _np(args), _np(out))) or out + 1)
        m.register_forward_hook(lambda mod, args, kwargs, out: log.append(("kw", kwargs["factor"], _np(out))),
                                with_kwargs=True)
        m.register_forward_hook(lambda mod, args, out: log.append(("prepended", _np(out))), prepend=True)
        return _np(m(_input(lib), factor=3.0))

    _compare(scenario)


def test_always_call_hooks_run_when_forward_raises() -> None:
    for name, lib in LIBS:
        nn = lib.nn

        class Broken(nn.Module):
            def forward(self, x: Any) -> Any:
                raise ValueError("boom")

        m = Broken()
        log: list[Any] = []
        m.register_forward_hook(lambda mod, args, out, log=log: log.append(("always", out)), always_call=True)
        m.register_forward_hook(lambda mod, args, out, log=log: log.append(("normal", out)))

        def noisy(mod: Any, args: Any, out: Any) -> None:
            raise RuntimeError("hook failed too")

        m.register_forward_hook(noisy, always_call=True)
        with pytest.warns(UserWarning, match="always_call=True.*hook failed too"):
            with pytest.raises(ValueError, match="boom"):
                m(_input(lib))
        assert log == [("always", None)], name


def test_global_forward_hooks_run_before_the_modules_own() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        hooks = torch_module_hooks if lib is torch else ember_module_hooks
        model = _mlp(lib)
        for i, m in enumerate(model):
            m.register_forward_pre_hook(lambda mod, args, i=i: log.append(("own pre", i)))
            m.register_forward_hook(lambda mod, args, out, i=i: log.append(("own", i, _np(out))))
        handles = [
            hooks.register_module_forward_pre_hook(lambda mod, args: log.append(("global pre", type(mod).__name__))),
            hooks.register_module_forward_hook(lambda mod, args, out: log.append(("global", type(mod).__name__))),
        ]
        try:
            out = model(_input(lib))
        finally:
            for h in handles:
                h.remove()
        model(_input(lib))  # global hooks gone
        return _np(out)

    _compare(scenario)


def test_removable_handles() -> None:
    m = ember.nn.Linear(2, 2)
    calls: list[str] = []
    h1 = m.register_forward_hook(lambda mod, a, o: calls.append("h1"), with_kwargs=False, always_call=True)
    h2 = m.register_forward_pre_hook(lambda mod, a, k: calls.append("h2"), with_kwargs=True)
    assert isinstance(h1, RemovableHandle) and h1.id != h2.id
    assert h1.id in m._forward_hooks_always_called and h2.id in m._forward_pre_hooks_with_kwargs
    with h1, h2:
        m(ember.ones(1, 2))
    h1.remove()  # again: nothing
    assert calls == ["h2", "h1"]
    assert not m._forward_hooks and not m._forward_hooks_always_called and not m._forward_pre_hooks_with_kwargs
    m(ember.ones(1, 2))
    assert calls == ["h2", "h1"]
    with pytest.raises(EmberError, match="callable"):
        m.register_forward_hook("not a function")


def test_a_module_without_hooks_has_empty_read_only_tables() -> None:
    m = ember.nn.Linear(2, 2)
    assert not m._forward_hooks and not m._backward_hooks and "_forward_hooks" not in m.__dict__
    other = ember.nn.Linear(2, 2)
    other.register_forward_hook(lambda *a: None)
    assert not m._forward_hooks  # one module's registration creates its own table only


def test_errors_inside_a_hooked_submodule_still_name_its_path() -> None:
    model = ember.nn.Sequential(ember.nn.Linear(4, 3), ember.nn.Linear(4, 2))
    model[1].register_forward_hook(lambda *a: None)
    with pytest.raises(EmberError, match=r"Sequential\.1 \(Linear\)"):
        model(ember.ones(2, 4))


def test_forward_hooks_work_without_autodiff_and_backward_hooks_are_inert_there() -> None:
    m = ember.nn.Linear(4, 2)
    seen: list[Any] = []
    m.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    m.register_full_backward_hook(lambda *a: seen.append("backward"))
    out = m(ember.tensor(X))
    assert seen == [(3, 2)] and out.device == ember.tensor(X).device


# ------------------------------------------------------------------------------------------------------------
# full backward hooks and backward pre-hooks
# ------------------------------------------------------------------------------------------------------------
def _log_backward(log: list[Any], tag: str) -> Callable[..., None]:
    def hook(mod: Any, grad_input: Any, grad_output: Any) -> None:
        log.append((tag, type(mod).__name__, _np(grad_input), _np(grad_output)))

    return hook


def test_full_backward_hooks_of_a_model_match_torch() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        model = _mlp(lib)
        for i, m in enumerate(model):
            m.register_full_backward_hook(_log_backward(log, f"layer {i}"))
            m.register_full_backward_pre_hook(lambda mod, go, i=i: log.append((f"pre {i}", _np(go))))
        model.register_full_backward_hook(_log_backward(log, "model"))
        x = _input(lib)
        (model(x) ** 2).sum().backward()
        return [_np(p.grad) for p in model.parameters()] + [_np(x.grad)]

    _compare(scenario)


def test_backward_hooks_can_replace_gradients() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        model = _mlp(lib)
        model[2].register_full_backward_pre_hook(lambda mod, go: (go[0] * -2,))  # changes layer 2's weight grads
        model[1].register_full_backward_hook(lambda mod, gi, go: (gi[0] * 0.5,))  # changes layer 0's
        model[0].register_full_backward_hook(_log_backward(log, "layer 0"))
        x = _input(lib)
        model(x).sum().backward()
        return [_np(p.grad) for p in model.parameters()] + [_np(x.grad)]

    _compare(scenario)


def test_backward_hooks_with_several_inputs_and_outputs() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        nn = lib.nn

        class Two(nn.Module):
            def forward(self, a: Any, b: Any, k: int = 3) -> Any:
                return a * 2 + b, b * k, (a * 0).sum()

        m = Two()
        m.register_full_backward_pre_hook(lambda mod, go: log.append(("pre", _np(go))))
        m.register_full_backward_hook(_log_backward(log, "full"))
        a, b = _input(lib), _input(lib, X * 2)
        u, v, _ = m(a, b, 4)
        (u * u).sum().backward()  # v and the third output get no gradient: None in grad_output
        u, v, _ = m(a, 5)  # a non-Tensor positional argument: None in grad_input
        (u + v).sum().backward()
        return _np(a.grad), _np(b.grad)

    _compare(scenario)


def test_backward_hooks_fire_at_the_outputs_when_no_input_requires_grad() -> None:
    for name, lib in LIBS:
        model = _mlp(lib)
        log: list[Any] = []
        model[0].register_full_backward_hook(_log_backward(log, "first"))
        with pytest.warns(UserWarning, match="no inputs require gradients"):
            model(_input(lib, requires_grad=False)).sum().backward()
        assert [(t, gi) for t, _, gi, _ in log] == [("first", (None,))], name
        assert log[0][3][0].shape == (3, 5)

        def bad(mod: Any, gi: Any, go: Any) -> Any:
            return (go[0],)

        model[0].register_full_backward_hook(bad)
        with pytest.warns(UserWarning), pytest.raises(Exception, match="should always return None"):
            model(_input(lib, requires_grad=False)).sum().backward()


def test_backward_hook_results_are_checked() -> None:
    model = _mlp(ember)
    model[2].register_full_backward_hook(lambda mod, gi, go: (gi[0], gi[0]))
    with pytest.raises(ember.AutodiffError, match="invalid number of grad_input, got 2, but expected 1"):
        model(_input(ember)).sum().backward()
    model = _mlp(ember)
    model[2].register_full_backward_pre_hook(lambda mod, go: (go[0][:1],))
    with pytest.raises(ember.AutodiffError, match="changed the size of value"):
        model(_input(ember)).sum().backward()


def test_global_backward_hooks_run_before_the_modules_own() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        hooks = torch_module_hooks if lib is torch else ember_module_hooks
        model = _mlp(lib)
        model[2].register_full_backward_hook(_log_backward(log, "own"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the model's own output-only firing does not concern this test
            handles = [hooks.register_module_full_backward_pre_hook(lambda mod, go: log.append(("global pre",))),
                       hooks.register_module_full_backward_hook(_log_backward(log, "global"))]
            try:
                x = _input(lib)
                model(x).sum().backward()
            finally:
                for h in handles:
                    h.remove()
        return _np(x.grad)

    _compare(scenario)


def test_backward_hooks_on_a_reused_module_fire_per_call() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        lin = _mlp(lib)[0]
        shrink = lib.nn.Linear(5, 4)
        with lib.no_grad():
            shrink.weight.copy_(_input(lib, np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5), False))
            shrink.bias.zero_()
        if lib is ember:
            shrink.to(AD)
        lin.register_full_backward_hook(_log_backward(log, "lin"))
        x = _input(lib)
        lin(shrink(lin(x))).sum().backward()
        return _np(x.grad)

    _compare(scenario)


def test_module_hooks_keep_the_hook_free_path_when_removed() -> None:
    m = _mlp(ember)
    h = m[0].register_full_backward_hook(lambda *a: None)
    assert m[0](_input(ember)).grad_fn() == "BackwardHookFunctionBackward"
    h.remove()
    assert m[0](_input(ember)).grad_fn() != "BackwardHookFunctionBackward"


def test_tensor_hooks_and_grads_survive_moving_a_model_to_its_own_device() -> None:
    """Registering hooks in ``__init__`` and calling ``model.to(device)`` afterwards is common: the parameters stay
    the same tensors, so their hooks and accumulated gradients stay too (as in torch)."""
    lin = ember.nn.Linear(4, 2).to(AD)
    fired: list[str] = []
    lin.weight.register_hook(lambda g: fired.append("hook"))
    lin.weight.register_post_accumulate_grad_hook(lambda t: fired.append("post"))
    lin(_input(ember)).sum().backward()
    lin.to(AD)
    assert lin.weight.grad is not None
    lin(_input(ember)).sum().backward()
    assert fired == ["hook", "post", "hook", "post"]


def test_to_dtype_converts_the_accumulated_gradients_as_torch() -> None:
    def scenario(lib: Any, log: list[Any]) -> Any:
        model = _mlp(lib)
        model(_input(lib)).sum().backward()
        model.double()
        return [(str(p.grad.dtype).split(".")[-1], _np(p.grad)) for p in model.parameters()]

    _compare(scenario)
