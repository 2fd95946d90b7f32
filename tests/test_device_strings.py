"""Device strings: ``Device.parse`` is a parser, not an attribute lookup. Only installed decorators may be named
(an automatic one also takes its on/off switch); everything else is a DeviceError naming the string, and malformed
syntax names the position. ``str(device)`` says what runs and parses back to the same device."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from ember import Device, DeviceError
from ember.plugins import CONTRACT_VERSION, hookimpl, manager


@pytest.fixture(scope="module")
def decorators() -> list[str]:
    manager.registry.ensure_loaded()
    if "autodiff" not in manager.registry.decorators:
        pytest.skip("ember-autodiff is not installed")
    return sorted(manager.registry.decorators)


# Device attributes and methods are not decorators: naming them must never call them (flex+default recursed
# forever, flex+seed(seed=1) reseeded the device, flex+__class__ built a Device)
@pytest.mark.parametrize("name", ["seed(seed=1)", "sync", "inner", "base", "stack", "__class__", "default",
                                  "parse", "flex", "cuda(0)", "memory_report", "junk", "_resolve", "__init__",
                                  "type", "set_default_dtype(float64)"])
def test_only_installed_decorators_may_be_named(decorators: list[str], name: str) -> None:
    spec = f"flex+{name}"
    with pytest.raises(DeviceError) as err:
        Device.parse(spec)
    msg = str(err.value)
    assert msg.startswith(f"cannot parse device {spec!r}:")
    assert f"{name.partition('(')[0]!r} is not an installed decorator" in msg
    assert f"installed decorators: {', '.join(decorators)}" in msg
    # flex and cuda are plugins, but of backends: the hint says so instead of naming an extra
    base = name.partition("(")[0]
    hint = ("registers no decorator of that name" if base in manager.registry.backends
            else "no plugin provides this decorator; see docs/plugins")
    assert hint in msg and "pip install" not in msg


def test_parsing_a_method_name_does_not_run_it(decorators: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(Device, "sync", lambda self: calls.append("sync"))
    monkeypatch.setattr(Device, "seed", lambda self, seed: calls.append(f"seed {seed}"))
    for spec in ("flex+sync", "flex+seed(seed=1)", "flex+seed(1)"):
        with pytest.raises(DeviceError):
            Device.parse(spec)
    assert calls == []


@pytest.mark.parametrize("spec, pos, what", [
    ("flex+autodiff(", 14, "missing ')'"),
    ("flex+autodiff)", 13, "')' without a matching '('"),
    ("flex+", 5, "expected a decorator name after '+'"),
    ("flex++autodiff", 5, "expected a decorator name after '+'"),
    ("", 0, "missing backend name"),
    ("+autodiff", 0, "missing backend name"),
    ("fl ex", 0, "'fl ex' is not a backend name"),
    ("flex+autodiff(checkpointing=balanced)x", 13, "unexpected '(checkpointing=balan'"),
    ("flex+autodiff(a=1)(b=2)", 14, "malformed decorator options"),
    ("flex+autodiff(a==1)", 14, "option value 'a == 1' is not a literal"),
    ("flex+autodiff(a=1,,b=2)", 18, "malformed decorator options"),
    ("flex+autodiff(x='unterminated)", 30, "unterminated string"),
    ("flex+autodiff(x=__import__('os').getcwd())", 16, "is not a literal"),
    ("flex+autodiff(x=[1, y])", 16, "is not a literal"),
    ("flex+autodiff(**{'a': 1})", 14, "'**' is not allowed"),
    ("flex+autodiff(*[1])", 14, "'*' is not allowed"),
    ("flex+1autodiff", 5, "expected a decorator name"),
])
def test_malformed_strings_name_the_position(decorators: list[str], spec: str, pos: int, what: str) -> None:
    with pytest.raises(DeviceError) as err:
        Device.parse(spec)
    assert str(err.value).startswith(f"cannot parse device {spec!r} at position {pos}: ")
    assert what in str(err.value)


def test_bad_index_and_non_strings() -> None:
    with pytest.raises(DeviceError, match=r"cannot parse device 'cuda:x': index 'x' is not an int"):
        Device.parse("cuda:x")
    with pytest.raises(DeviceError, match="index '-1' is not an int"):
        Device.parse("flex:-1")
    with pytest.raises(DeviceError, match="expected a device string, got int"):
        Device.parse(3)  # type: ignore[arg-type]


def test_options_are_literals_or_plain_words(decorators: list[str]) -> None:
    dev = Device.parse("flex + autodiff( checkpointing = balanced )")
    assert dev is Device.flex().autodiff(checkpointing="balanced")
    assert Device.parse("FLEX+autodiff").kind == "flex"
    odd = Device.flex().autodiff(note="a,b)+c", level=-2, ratio=0.5, flag=None, shape=(1, 2))
    assert Device.parse(str(odd)) is odd  # quoted where needed: commas, '+' and ')' inside text survive


def test_quotes_escapes_and_unhashable_options(decorators: list[str]) -> None:
    dev = Device.parse("flex+autodiff(note='it\\'s (a+b)')")
    assert dev.decorators == (("autodiff", (("note", "it's (a+b)"),)),) and Device.parse(str(dev)) is dev
    for spec in ("flex+autodiff(x=[1, 2])", "flex+autodiff(x={'a': 1})"):
        with pytest.raises(DeviceError, match="option values must be hashable"):
            Device.parse(spec)
    with pytest.raises(DeviceError, match="must be hashable"):
        Device.flex().autodiff(x=[1])


def test_positional_options_of_a_named_decorator_are_refused(decorators: list[str]) -> None:
    with pytest.raises(DeviceError, match=r"cannot parse device 'flex\+autodiff\(1\)': .*options are keyword"):
        Device.parse("flex+autodiff(1)")
    with pytest.raises(DeviceError, match=r"'flex\+fusion\(2\)': .*expected one bool"):
        Device.parse("flex+fusion(2)")


# -- automatic decorators: switches and labels (issue 14 item 9) ---------------------------------------------------
@pytest.fixture
def fusion(decorators: list[str]) -> None:
    if "fusion" not in decorators:
        pytest.skip("ember-fusion is not installed")


@pytest.mark.parametrize("spec", ["flex+fusion(False)", "flex+fusion(enabled=False)", "flex+fusion(enabled=off)",
                                  "flex+fusion(enabled=no)"])
def test_automatic_switch_spellings(fusion: None, spec: str) -> None:
    assert Device.parse(spec) is Device.flex().fusion(False)


def test_opted_out_automatic_decorator_is_in_the_label(fusion: None) -> None:
    off = Device.flex().fusion(False).autodiff()
    assert str(off) == "flex+fusion(enabled=False)+autodiff" != str(Device.flex().autodiff())
    # automatic settings apply innermost whatever the order they are given in: one device, one label
    assert Device.flex().autodiff().fusion(False) is off
    assert Device.parse("flex+autodiff+fusion(False)") is off
    assert Device.parse(str(off)) is off and off.inner is Device.flex().fusion(False)
    # on, named: the decorator is asked for (flex declines it unnamed), so it is part of the device
    assert Device.parse("flex+fusion(True)+autodiff") is Device.flex().fusion().autodiff()
    assert str(Device.flex().fusion(True).autodiff()) == "flex+fusion+autodiff"


def test_globally_switched_off_fusion_shows_in_the_label(fusion: None) -> None:
    """EMBER_FUSION=0 ran flex+autodiff unfused under the fused device's name; the label now says so."""
    code = (
        "import ember; from ember import Device\n"
        "d = Device.flex().autodiff()\n"
        "print(str(d)); print(repr(d)); print(type(d.stack.inner).__name__)\n"
        "print(Device.parse(str(d)) is d, Device.flex().fusion(False) is Device.flex(), str(Device.flex()))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "EMBER_FUSION": "0"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "flex+fusion(enabled=False)+autodiff",
        "Device.flex().fusion(enabled=False).autodiff()",
        "FlexBackend",
        "True True flex+fusion(enabled=False)",
    ]


@pytest.mark.parametrize("spec", ["flex", "flex+autodiff", "flex+autodiff(checkpointing=balanced)",
                                  "flex+fusion(enabled=False)+autodiff", "flex+fusion(max_pending=8)+autodiff",
                                  "toy", "toy+autodiff"])
def test_round_trips(decorators: list[str], spec: str) -> None:
    try:
        dev = Device.parse(spec)
    except DeviceError as exc:  # fusion or the example backend may not be installed
        pytest.skip(str(exc))
    except Exception as exc:
        if type(exc).__name__ != "PluginError":
            raise
        pytest.skip(str(exc))
    assert str(dev) == spec and Device.parse(str(dev)) is dev


def test_decorator_names_that_clash_with_device_attributes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_STRICT_PLUGINS", raising=False)
    fresh = manager.PluginRegistry()

    class Plugin:
        @hookimpl
        def register_decorators(self, register: Any) -> None:
            register("sync", lambda inner: inner, contract=CONTRACT_VERSION)

    fresh.register_plugin(Plugin(), name="clash")
    assert "sync" not in fresh.decorators
    assert "'sync' must be a public identifier" in next(p for p in fresh.plugins if p.name == "clash").error

    class BadBackend:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            register("my+gpu", lambda index: None, contract=CONTRACT_VERSION)

    fresh.register_plugin(BadBackend(), name="badbackend")
    assert "my+gpu" not in fresh.backends
    assert "cannot appear in a device string" in next(p for p in fresh.plugins if p.name == "badbackend").error


def test_a_decorator_may_take_named_options_by_position() -> None:
    """``positional=("channel",)``: ``dev.tagger("local")`` and ``flex+tagger(local)`` are ``tagger(channel=local)``."""
    reg = manager.registry.ensure_loaded()

    class Plugin:
        @hookimpl
        def register_decorators(self, register: Any) -> None:
            register("tagger", lambda inner, **options: inner, contract=CONTRACT_VERSION, positional=("channel",))

    plugin = Plugin()
    reg.register_plugin(plugin, name="tagger-test")
    try:
        by_position = Device.flex().tagger("local")
        assert by_position is Device.flex().tagger(channel="local")
        assert by_position is Device.parse("flex+tagger(local)") is Device.parse("flex+tagger(channel=local)")
        assert str(by_position) == "flex+tagger(channel=local)"
        with pytest.raises(DeviceError, match=r"tagger\(\): option\(s\) \['channel'\] given both by position and "
                                              r"by keyword"):
            Device.flex().tagger("local", channel="other")
        with pytest.raises(DeviceError, match=r"options are keyword arguments after 1 positional \(channel\)"):
            Device.flex().tagger("local", "extra")
    finally:
        reg._manager().unregister(plugin)
        reg.plugins[:] = [p for p in reg.plugins if p.name != "tagger-test"]
        reg.decorators.pop("tagger", None)


def test_a_backend_may_take_named_options_by_position() -> None:
    """``positional=("address",)``: ``Device.faraway("ember://h:1/flex")`` is ``Device.faraway(address=...)``;
    other backends keep ``Device.<kind>(index)``."""
    reg = manager.registry.ensure_loaded()

    class Plugin:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            register("faraway", lambda index, **options: None, contract=CONTRACT_VERSION, positional=("address",))

    plugin = Plugin()
    reg.register_plugin(plugin, name="faraway-test")
    try:
        dev = Device.faraway("ember://h:1/flex", token="t")
        assert (dev.kind, dev.index, dict(dev.options)) == ("faraway", 0, {"address": "ember://h:1/flex", "token": "t"})
        assert dev is Device.faraway(address="ember://h:1/flex", token="t")
        with pytest.raises(DeviceError, match=r"option\(s\) \['address'\] given both by position and by keyword"):
            Device.faraway("a", address="b")
        with pytest.raises(DeviceError, match=r"takes 1 positional argument\(s\) \(address\), got 2"):
            Device.faraway("a", "b")
        assert Device.flex(0) is Device.flex() is Device.flex(index=0)
        with pytest.raises(DeviceError, match="takes the device index and keyword options"):
            Device.flex(0, 1)
    finally:
        reg._manager().unregister(plugin)
        reg.plugins[:] = [p for p in reg.plugins if p.name != "faraway-test"]
        reg.backends.pop("faraway", None)


def test_credentials_in_device_options_never_show_in_reprs() -> None:
    dev = Device("flex", 0, (("address", "ember://h:1/flex"), ("token", "s3cret"), ("api_key", "k")))
    text = repr(dev) + str(dev)
    assert "s3cret" not in text and "'k'" not in text
    assert "'token': '***'" in repr(dev) and "ember://h:1/flex" in repr(dev)
    assert dict(dev.options)["token"] == "s3cret"  # the backend still gets the value
