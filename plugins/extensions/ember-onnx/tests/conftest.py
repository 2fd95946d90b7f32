"""Shared fixtures of ember-onnx's tests: the devices the importer is checked on."""

from __future__ import annotations

import pytest

import ember


@pytest.fixture(params=["flex", "flex+autodiff"])
def device(request: pytest.FixtureRequest) -> ember.Device:
    """Each CPU device stack an imported model must run on."""
    return ember.Device.parse(request.param)
