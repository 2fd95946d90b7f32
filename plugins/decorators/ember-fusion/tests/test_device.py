"""The plugin on devices: automatic decoration, opting out, options, parse/str round trips, registration."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device, DeviceError, ValueRangeError
from ember_fusion import CONTRACT
from ember_fusion.backend import FusionBackend
from ember_fusion.plugin import _factory, enabled_by_environment, fuses_unnamed, supports_fusion


@pytest.fixture
def fused_dev(default_fused_dev: Device) -> Device:
    """Device identity and options: the default fused flex device itself (conftest's records every op)."""
    return default_fused_dev


def test_registered_as_an_automatic_decorator() -> None:
    from ember.plugins.manager import registry

    spec = registry.decorator("fusion")
    assert spec is not None and spec.automatic
    assert CONTRACT == 1


def test_fused_flex_stack(fused_dev: Device) -> None:
    stack = fused_dev.stack
    assert isinstance(stack, FusionBackend)
    assert stack.name == "flex+fusion" and "fusion over" in stack.describe()
    assert "fusion_plan_hits" in fused_dev.memory_report()
    # under the autodiff decorator: Autodiff(Fusion(flex))
    assert isinstance(fused_dev.autodiff().stack.inner, FusionBackend)


def test_fusion_false_gives_an_unfused_stack(fused_dev: Device) -> None:
    off = fused_dev.fusion(False)
    assert not isinstance(off.stack, FusionBackend)
    assert off.stack is fused_dev.stack.inner  # the same flex backend: one memory pool, one random stream
    assert not isinstance(off.autodiff().stack.inner, FusionBackend)
    x = ember.tensor([1.0, 2.0], device=off) * 3
    assert type(x._h).__name__ != "FArray"
    np.testing.assert_array_equal(x.numpy(), [3.0, 6.0])
    assert "fusion_plan_hits" not in off.memory_report()


def test_fusion_on_again_is_the_plain_device(fused_dev: Device) -> None:
    assert fused_dev.fusion(True) is fused_dev
    assert fused_dev.fusion() is fused_dev
    assert fused_dev.fusion(False).fusion(True) is fused_dev
    assert fused_dev.fusion(False).fusion(max_pending=4).stack.max_pending == 4


@pytest.mark.parametrize("spec", ["flex+fusion(enabled=False)", "flex+fusion(enabled=False)+autodiff",
                                  "flex+fusion(max_pending=8)", "flex+autodiff"])
def test_parse_and_str_round_trip(fused_dev: Device, spec: str) -> None:
    dev = Device.parse(spec)
    assert str(dev) == spec
    assert Device.parse(str(dev)) is dev


def test_parse_enabled_false_is_fusion_false(fused_dev: Device) -> None:
    dev = Device.parse("flex+fusion(enabled=False)")
    assert dev is fused_dev.fusion(False)
    assert str(fused_dev.fusion(False)) == "flex+fusion(enabled=False)"
    assert Device.parse("flex+fusion(enabled=off)") is dev
    assert Device.parse("flex+fusion(enabled=true)") is fused_dev
    assert not isinstance(dev.stack, FusionBackend)


def test_parse_round_trip_of_a_non_string_option(fused_dev: Device) -> None:
    dev = fused_dev.fusion(max_pending=8)
    assert Device.parse(str(dev)) is dev


def test_max_pending_from_a_parsed_spec(fused_dev: Device) -> None:
    stack = Device.parse("flex+fusion(max_pending=3)").stack
    assert isinstance(stack, FusionBackend) and stack.max_pending == 3


@pytest.mark.parametrize("options", [{"max_pending": 0}, {"max_pending": -3}, {"max_pending": "abc"},
                                     {"bogus": 1}])
def test_bad_options_raise_value_range_error(fused_dev: Device, options: dict[str, Any]) -> None:
    with pytest.raises(ValueRangeError, match="fusion"):
        fused_dev.fusion(**options).stack  # noqa: B018 - resolving the stack runs the factory


def test_max_pending_of_a_wrong_type_raises_value_range_error(fused_dev: Device) -> None:
    with pytest.raises(ValueRangeError):
        fused_dev.fusion(max_pending=(4,)).stack  # noqa: B018


def test_max_pending_must_be_integral(fused_dev: Device) -> None:
    with pytest.raises(ValueRangeError):
        fused_dev.fusion(max_pending=2.5).stack  # noqa: B018


@pytest.mark.parametrize("args,kwargs", [((1,), {}), ((False, True), {}), ((False,), {"max_pending": 3}),
                                         (("no",), {})])
def test_bad_switches_raise_device_error(fused_dev: Device, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(DeviceError):
        fused_dev.fusion(*args, **kwargs)


def test_bad_enabled_value_in_a_spec() -> None:
    with pytest.raises(DeviceError, match="enabled"):
        Device.parse("flex+fusion(enabled=maybe)")


def _stack_type_in_subprocess(env_value: str | None, device: str = "ember.Device.flex().fusion()") -> str:
    env = dict(os.environ)
    env.pop("EMBER_DEVICE", None)
    if env_value is None:
        env.pop("EMBER_FUSION", None)
    else:
        env["EMBER_FUSION"] = env_value
    code = f"import ember; print(type({device}.stack).__name__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_ember_fusion_environment_switch(fused_dev: Device, value: str) -> None:
    assert _stack_type_in_subprocess(value) == "FlexBackend"


def test_named_fusion_in_a_fresh_process(fused_dev: Device) -> None:
    assert _stack_type_in_subprocess(None) == "FusionBackend"
    assert _stack_type_in_subprocess("1") == "FusionBackend"
    # flex declines automatic fusion (fuse_by_default = False): the plain device is unfused, switch or not
    assert _stack_type_in_subprocess(None, "ember.Device.flex()") == "FlexBackend"
    assert _stack_type_in_subprocess("1", "ember.Device.flex().autodiff().inner") == "FlexBackend"


def test_automatic_fusion_follows_the_backends_declaration(interp_cls: type) -> None:
    from ember.plugins.manager import registry

    spec = registry.decorator("fusion")
    assert spec is not None and spec.applies_to is fuses_unnamed

    class Eager(interp_cls):  # type: ignore[misc, valid-type]
        fuse_by_default = True

    assert not fuses_unnamed(interp_cls())  # a flex subclass inherits flex's "no"
    assert fuses_unnamed(Eager()) and spec.applies_unnamed(Eager())
    assert not fuses_unnamed(Device.flex().fusion().stack)  # a decorator does not generate code itself
    # named, it applies whatever the backend prefers; the factory itself does not look at the preference
    assert isinstance(_factory(interp_cls()), FusionBackend)
    assert str(Device.flex().fusion()) == "flex+fusion" and Device.flex().fusion() is not Device.flex()


def test_enabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_FUSION", " NO ")
    assert not enabled_by_environment()
    monkeypatch.setenv("EMBER_FUSION", "yes")
    assert enabled_by_environment()
    monkeypatch.delenv("EMBER_FUSION")
    assert enabled_by_environment()


def test_factory_wraps_only_backends_that_support_fusion(interp_cls: type) -> None:
    FlexBackend = type(Device.flex().stack.base_backend)  # through the device: no plugin import

    class NoFusion(FlexBackend):
        pass

    NoFusion.fusion_compile = ember.backend.Backend.fusion_compile  # type: ignore[method-assign]
    plain = NoFusion()
    assert not supports_fusion(plain)
    assert _factory(plain) is plain  # a backend without code generation is left alone
    wrapped = _factory(interp_cls(), max_pending="16")
    assert isinstance(wrapped, FusionBackend) and wrapped.max_pending == 16


def test_factory_honours_the_environment(monkeypatch: pytest.MonkeyPatch, interp_cls: type) -> None:
    monkeypatch.setenv("EMBER_FUSION", "0")
    be = interp_cls()
    assert _factory(be) is be


def test_a_fused_stack_is_not_fused_again() -> None:
    fused = Device.flex().fusion().stack
    assert isinstance(fused, FusionBackend)
    assert not supports_fusion(fused) and _factory(fused) is fused
