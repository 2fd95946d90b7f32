"""Transforms on numpy arrays (images are CHW). Random transforms take an optional ``rng`` (a numpy Generator):
:class:`ember_train.data.TransformDataset` passes one derived from (seed, epoch, index) so augmentation is
reproducible and independent of worker threads; without one they use their own seeded Generator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.errors import ShapeError, ValueRangeError


def _call(t: Callable[..., Any], x: Any, rng: np.random.Generator | None) -> Any:
    return t(x, rng=rng) if isinstance(t, Transform) else t(x)


class Transform:
    """Base class: ``t(x, rng=None) -> x'``."""

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Compose(Transform):
    """Apply transforms in order (plain callables taking one argument are allowed too)."""

    def __init__(self, transforms: Sequence[Callable[..., Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> Any:
        for t in self.transforms:
            x = _call(t, x, rng)
        return x


class ToFloat(Transform):
    """Cast to float32; integer arrays are divided by ``scale`` (default: 255 for uint8, else 1)."""

    def __init__(self, scale: float | None = None) -> None:
        self.scale = scale

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        a = np.asarray(x)
        scale = self.scale if self.scale is not None else (255.0 if a.dtype == np.uint8 else 1.0)
        return (a.astype(np.float32) / np.float32(scale)) if scale != 1.0 else a.astype(np.float32)


class Normalize(Transform):
    """``(x - mean[c]) / std[c]`` per channel of a CHW array (scalars apply to every channel)."""

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float]) -> None:
        self.mean = np.asarray(mean, dtype=np.float32).reshape(-1)
        self.std = np.asarray(std, dtype=np.float32).reshape(-1)
        if self.mean.shape != self.std.shape:
            raise ShapeError(f"Normalize: mean has {self.mean.size} values, std {self.std.size}")
        if np.any(self.std <= 0):
            raise ValueRangeError(f"Normalize: std must be > 0, got {self.std.tolist()}")

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        a = np.asarray(x, dtype=np.float32)
        c = self.mean.size
        if c > 1 and (a.ndim < 3 or a.shape[0] != c):
            raise ShapeError(f"Normalize: {c} channel statistics but the input has shape {a.shape} (expected CHW)")
        shape = (c,) + (1,) * (a.ndim - 1) if c > 1 else (1,)
        return (a - self.mean.reshape(shape)) / self.std.reshape(shape)


class RandomCrop(Transform):
    """Zero-pad the last two dims by ``padding`` then crop a random ``size`` window."""

    def __init__(self, size: int | tuple[int, int], padding: int = 0, seed: int | None = None) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.padding = int(padding)
        if self.padding < 0 or min(self.size) < 1:
            raise ValueRangeError(f"RandomCrop: size {self.size} must be >= 1 and padding {padding} >= 0")
        self._own = np.random.default_rng(seed)

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        a = np.asarray(x)
        if a.ndim < 2:
            raise ShapeError(f"RandomCrop: needs at least 2 dims (H, W), got shape {a.shape}")
        p = self.padding
        if p:
            a = np.pad(a, [(0, 0)] * (a.ndim - 2) + [(p, p), (p, p)])
        h, w = a.shape[-2:]
        th, tw = self.size
        if th > h or tw > w:
            raise ShapeError(f"RandomCrop: crop {self.size} larger than the padded input {(h, w)}")
        g = self._own if rng is None else rng
        i = int(g.integers(0, h - th + 1))
        j = int(g.integers(0, w - tw + 1))
        return np.ascontiguousarray(a[..., i:i + th, j:j + tw])


class RandomHorizontalFlip(Transform):
    """Flip the last dim with probability ``p``."""

    def __init__(self, p: float = 0.5, seed: int | None = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueRangeError(f"RandomHorizontalFlip: p must lie in [0, 1], got {p}")
        self.p = float(p)
        self._own = np.random.default_rng(seed)

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        a = np.asarray(x)
        g = self._own if rng is None else rng
        return np.ascontiguousarray(a[..., ::-1]) if g.random() < self.p else a


class Lambda(Transform):
    """Wrap a one-argument function."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> Any:
        return self.fn(x)


__all__ = ["Transform", "Compose", "ToFloat", "Normalize", "RandomCrop", "RandomHorizontalFlip", "Lambda"]
