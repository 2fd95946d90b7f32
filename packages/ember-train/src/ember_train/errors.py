"""ember-train's errors; each derives from :class:`ember.EmberError` and the matching Python built-in."""

from __future__ import annotations

from ember.errors import EmberError


class DatasetNotFoundError(EmberError, FileNotFoundError):
    """A dataset path the user must provide does not exist (nothing is ever downloaded)."""


class DatasetFormatError(EmberError, ValueError):
    """A dataset file or folder exists but its contents are not what the loader expects."""


class CollateError(EmberError, TypeError):
    """The items of a batch cannot be stacked (mismatched shapes, strings, mixed field counts ...)."""


__all__ = ["DatasetNotFoundError", "DatasetFormatError", "CollateError"]
