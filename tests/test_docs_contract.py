"""docs/contract.md is the backend contract op by op: it must name every public member of ``Backend``, every
elementwise op name, and list each required primitive under "Required primitives" and each default composition
under "Default compositions", so the page cannot drift from ``ember/backend.py``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from ember.backend import BINARY_OPS, UNARY_OPS, Backend

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The text of the level-2 section ``## title`` up to the next level-2 heading."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, flags=re.S | re.M)
    assert m is not None, f"docs/contract.md has no section '## {title}'"
    return m.group(1)


def _public_methods() -> list[str]:
    return sorted(n for n, v in vars(Backend).items() if not n.startswith("_") and inspect.isfunction(v))


def _is_required(name: str) -> bool:
    # a required primitive is one whose base implementation only raises "missing primitive"
    return "self._missing(" in inspect.getsource(getattr(Backend, name))


REQUIRED = [n for n in _public_methods() if _is_required(n)]
DEFAULTS = [n for n in _public_methods() if not _is_required(n)]


def test_the_backend_has_both_kinds_of_methods() -> None:
    # guards the classification below: if it silently found nothing, every other test would pass vacuously
    assert {"unary", "binary", "reduce", "matmul", "getitem", "rand"} <= set(REQUIRED)
    assert {"conv", "softmax", "gather", "pad", "sync"} <= set(DEFAULTS)


@pytest.mark.parametrize("name", _public_methods())
def test_every_public_backend_method_is_documented_with_its_call(name: str) -> None:
    assert f"`{name}(" in DOC, f"docs/contract.md does not document Backend.{name}(...)"


@pytest.mark.parametrize("name", REQUIRED)
def test_required_primitives_are_listed_as_required(name: str) -> None:
    assert f"`{name}(" in _section("Required primitives"), (
        f"Backend.{name} is a required primitive but is not in the 'Required primitives' section"
    )
    assert f"`{name}(" not in _section("Default compositions"), (
        f"Backend.{name} is a required primitive but is listed among the default compositions"
    )


DEVICE_MANAGEMENT = ("sync", "memory_report", "memory_dry_run", "describe", "lift", "lower")


@pytest.mark.parametrize("name", [n for n in DEFAULTS if n not in DEVICE_MANAGEMENT])
def test_default_compositions_are_listed_as_compositions(name: str) -> None:
    assert f"`{name}(" in _section("Default compositions"), (
        f"Backend.{name} has a default composition but is not in the 'Default compositions' section"
    )


def test_required_primitive_signatures_match_the_code() -> None:
    section = _section("Required primitives")
    for name in REQUIRED:
        params = [p for p in inspect.signature(getattr(Backend, name)).parameters if p != "self"]
        sig = f"`{name}({', '.join(params)})`"
        assert sig in section, f"docs/contract.md should show {sig} (the parameters of Backend.{name})"


@pytest.mark.parametrize("attr", ["name", "contract_version", "supported_dtypes"])
def test_backend_attributes_are_documented(attr: str) -> None:
    assert hasattr(Backend, attr)
    assert f"`{attr}`" in DOC, f"docs/contract.md does not document Backend.{attr}"


@pytest.mark.parametrize("op", sorted(UNARY_OPS | BINARY_OPS))
def test_every_elementwise_op_name_is_documented(op: str) -> None:
    assert f"`{op}`" in _section("Required primitives"), f"docs/contract.md does not list the elementwise op {op!r}"
