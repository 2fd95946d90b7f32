"""PyTorch's ``torch.utils`` names for ports: ``ember.utils.data`` is the training package's data module.

Core does not depend on the training package (``ember-train`` depends on core), so nothing here imports it until
``ember.utils.data`` is used.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # ember.utils.data without an explicit import of the submodule (import ember; ember.utils.data.DataLoader)
    if name == "data":
        from importlib import import_module

        return import_module(f"{__name__}.data")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
