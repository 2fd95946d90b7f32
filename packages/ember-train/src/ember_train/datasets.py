"""Built-in datasets (no download, ever) and loaders for data the user already has (IDX, CSV, image folders)."""

from __future__ import annotations

import csv
import functools
import gzip
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import ValueRangeError

from .data import Dataset, TensorDataset
from .errors import DatasetFormatError, DatasetNotFoundError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def _require(path: Any, what: str) -> Path:
    p = Path(os.fspath(path)).expanduser()
    if not p.exists():
        raise DatasetNotFoundError(f"{what} not found at {str(p)!r}; ember never downloads data, provide this path")
    return p


# --- digits ----------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4)
def _digits_resized(size: int) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = d.images.astype(np.float32) / np.float32(16.0)  # 0..16 -> [0, 1]
    if size != 8:
        # bilinear resize in float mode "F" keeps full precision (no uint8 rounding)
        imgs = np.stack([
            np.asarray(Image.fromarray(im, mode="F").resize((size, size), Image.Resampling.BILINEAR))
            for im in imgs
        ]).astype(np.float32)
    return imgs, d.target.astype(np.int64)


def _stratified_split(labels: np.ndarray, valid_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train, valid = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(valid_fraction * idx.size))
        valid.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(valid))


def digits(split: str = "train", size: int = 28, valid_fraction: float = 0.2, seed: int = 0) -> TensorDataset:
    """The 1797 UCI handwritten digits bundled with scikit-learn, resized to ``size``x``size`` (bilinear).

    Items: (float32 image (1, size, size), int64 label 0..9). Pixels are scaled to [0, 1] then normalised with
    the train split's mean and std (attributes ``mean``, ``std``; also ``classes``). The split is stratified per
    class and seeded, so train and valid never overlap for a given seed.
    """
    if split not in ("train", "valid"):
        raise ValueRangeError(f"digits: split must be 'train' or 'valid', got {split!r}")
    if not 0.0 < valid_fraction < 1.0:
        raise ValueRangeError(f"digits: valid_fraction must lie in (0, 1), got {valid_fraction}")
    if not isinstance(size, int) or size < 1:
        raise ValueRangeError(f"digits: size must be a positive int, got {size!r}")
    imgs, labels = _digits_resized(size)
    tr, va = _stratified_split(labels, valid_fraction, seed)
    mean = float(imgs[tr].mean())
    std = float(imgs[tr].std())
    idx = tr if split == "train" else va
    x = ((imgs[idx] - np.float32(mean)) / np.float32(std)).astype(np.float32)[:, None]
    ds = TensorDataset(x, labels[idx])
    ds.mean, ds.std, ds.classes, ds.split = mean, std, list(range(10)), split  # type: ignore[attr-defined]
    return ds


# --- synthetic -------------------------------------------------------------------------------------------------

def synthetic_regression(n: int = 1000, features: int = 8, noise: float = 0.1, seed: int = 0) -> TensorDataset:
    """``y = x @ w + b + noise * eps`` with x ~ N(0, 1); items (float32 x (features,), float32 y (1,)).

    The true ``weight`` (features,) and ``bias`` are attributes, so a fitted model can be checked against them.
    """
    if n < 1 or features < 1 or noise < 0:
        raise ValueRangeError(f"synthetic_regression: need n >= 1, features >= 1, noise >= 0; got {n}, {features}, "
                              f"{noise}")
    rng = np.random.default_rng(seed)
    w = rng.normal(size=features).astype(np.float32)
    b = np.float32(rng.normal())
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x @ w + b + noise * rng.normal(size=n)).astype(np.float32)[:, None]
    ds = TensorDataset(x, y)
    ds.weight, ds.bias = w, float(b)  # type: ignore[attr-defined]
    return ds


def synthetic_sequences(n: int = 2000, seq_len: int = 32, vocab: int = 64, classes: int = 4,
                        seed: int = 0) -> TensorDataset:
    """A learnable text-classification task: items (int64 tokens (seq_len,), int64 label).

    Token 0 is reserved for padding and never appears. Each class owns a block of ``marker`` tokens; a sequence
    of class c is uniform noise from the shared tokens with a few of c's markers planted at random positions,
    so the label is decided by which markers occur (attributes ``markers``, ``classes``).
    """
    per = max(1, (vocab - 1) // (2 * classes))  # half the vocabulary is markers, half shared noise
    if classes < 2 or seq_len < 2 or vocab < 1 + classes * per + 1:
        raise ValueRangeError(f"synthetic_sequences: need classes >= 2, seq_len >= 2 and vocab >= 2 * classes + 2; "
                              f"got classes={classes}, seq_len={seq_len}, vocab={vocab}")
    rng = np.random.default_rng(seed)
    markers = 1 + np.arange(classes * per).reshape(classes, per)
    noise_lo = 1 + classes * per
    labels = rng.integers(0, classes, size=n).astype(np.int64)
    tokens = rng.integers(noise_lo, vocab, size=(n, seq_len)).astype(np.int64)
    k = max(1, seq_len // 8)  # planted markers per sequence
    pos = np.argsort(rng.random((n, seq_len)), axis=1)[:, :k]
    which = rng.integers(0, per, size=(n, k))
    np.put_along_axis(tokens, pos, markers[labels[:, None], which], axis=1)
    ds = TensorDataset(tokens, labels)
    ds.markers, ds.classes, ds.vocab = markers, list(range(classes)), vocab  # type: ignore[attr-defined]
    return ds


# --- IDX (MNIST) -----------------------------------------------------------------------------------------------

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_CODES = {np.dtype(v).newbyteorder("=").str.lstrip("<>|="): k for k, v in _IDX_TYPES.items()}


def _open_maybe_gz(p: Path) -> bytes:
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the suffix
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DatasetFormatError(f"IDX file {str(p)!r}: corrupt gzip data ({e})") from None
    return raw


def read_idx(path: Any) -> np.ndarray:
    """Parse an IDX file (optionally gzipped): magic ``00 00 <type> <ndim>``, big-endian int32 dims, data."""
    p = _require(path, "IDX file")
    raw = _open_maybe_gz(p)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DatasetFormatError(f"{str(p)!r} is not an IDX file: magic bytes {raw[:4].hex()} (expected 0000tt0n "
                                 f"with type tt in {[hex(t) for t in _IDX_TYPES]})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetFormatError(f"IDX file {str(p)!r}: truncated header ({len(raw)} bytes for {ndim} dims)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    if any(d < 0 for d in dims):  # the format stores signed int32 sizes; a negative one is a damaged header
        raise DatasetFormatError(f"IDX file {str(p)!r}: negative dimension in the header dims {dims}")
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    need = math.prod(dims) * dtype.itemsize  # Python ints: a huge product must not wrap around
    if len(raw) - header != need:
        raise DatasetFormatError(f"IDX file {str(p)!r}: dims {dims} of {dtype.name} need {need} data bytes, "
                                 f"found {len(raw) - header}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path: Any, array: Any) -> None:
    """Write an array as an IDX file (gzipped when the name ends in .gz)."""
    a = np.asarray(array)
    key = a.dtype.newbyteorder("=").str.lstrip("<>|=")
    if key not in _IDX_CODES:
        raise DatasetFormatError(f"write_idx: dtype {a.dtype} has no IDX type code (uint8, int8, int16, int32, "
                                 "float32, float64)")
    code = _IDX_CODES[key]
    data = bytes([0, 0, code, a.ndim]) + np.asarray(a.shape, dtype=">i4").tobytes()
    data += a.astype(_IDX_TYPES[code]).tobytes()
    p = Path(os.fspath(path))
    p.write_bytes(gzip.compress(data) if p.name.endswith(".gz") else data)


def mnist_idx(images_path: Any, labels_path: Any) -> TensorDataset:
    """MNIST-style IDX files the user provides: items (float32 image (1, H, W) in [0, 1], int64 label)."""
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3:
        raise DatasetFormatError(f"mnist_idx: images file {str(images_path)!r} holds shape {images.shape}, "
                                 "expected (N, H, W)")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise DatasetFormatError(f"mnist_idx: labels file {str(labels_path)!r} holds shape {labels.shape}, expected "
                                 f"({images.shape[0]},) to match {images.shape[0]} images")
    scale = np.float32(255.0) if images.dtype == np.uint8 else np.float32(1.0)
    x = (images.astype(np.float32) / scale)[:, None]
    y = labels.astype(np.int64)
    ds = TensorDataset(x, y)
    ds.classes = sorted(int(c) for c in np.unique(y))  # type: ignore[attr-defined]
    return ds


# --- CSV -------------------------------------------------------------------------------------------------------

def _as_number(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def csv_dataset(path: Any, target_column: str, task: str = "regression") -> TensorDataset:
    """A CSV file with a header row: every column but ``target_column`` is a float32 feature.

    ``task="regression"``: targets are float32 of shape (1,). ``task="classification"``: labels map to int64
    indices into the stable class list ``dataset.classes`` (sorted numerically when all labels are numbers,
    else as strings). Also ``feature_names``.
    """
    if task not in ("regression", "classification"):
        raise ValueRangeError(f"csv_dataset: task must be 'regression' or 'classification', got {task!r}")
    p = _require(path, "CSV file")
    if p.is_dir():
        raise DatasetFormatError(f"csv_dataset: {str(p)!r} is a directory, expected a CSV file")
    with p.open(newline="") as f:
        rows = list(csv.reader(f))
    rows = [r for r in rows if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise DatasetFormatError(f"csv_dataset: {str(p)!r} needs a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    if target_column not in header:
        raise DatasetFormatError(f"csv_dataset: {str(p)!r} has no column {target_column!r}; columns: {header}")
    t = header.index(target_column)
    feats = [i for i in range(len(header)) if i != t]
    body = rows[1:]
    for r, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DatasetFormatError(f"csv_dataset: {str(p)!r} line {r} has {len(row)} fields, header has "
                                     f"{len(header)}")
    try:
        x = np.array([[float(row[i]) for i in feats] for row in body], dtype=np.float32).reshape(len(body), len(feats))
    except ValueError:
        for r, row in enumerate(body, start=2):
            for i in feats:
                if _as_number(row[i]) is None:
                    raise DatasetFormatError(f"csv_dataset: {str(p)!r} line {r} column {header[i]!r}: "
                                             f"{row[i]!r} is not a number (features must be numeric)") from None
        raise
    raw_t = [row[t].strip() for row in body]
    if task == "regression":
        vals = [_as_number(v) for v in raw_t]
        bad = [k for k, v in enumerate(vals) if v is None]
        if bad:
            raise DatasetFormatError(f"csv_dataset: {str(p)!r} line {bad[0] + 2} target {raw_t[bad[0]]!r} is not a "
                                     "number (use task='classification' for labels)")
        y = np.asarray(vals, dtype=np.float32)[:, None]
        classes = None
    else:
        uniq = set(raw_t)
        nums = {u: _as_number(u) for u in uniq}
        if all(v is not None for v in nums.values()):
            classes = sorted(uniq, key=lambda u: (nums[u], u))
        else:
            classes = sorted(uniq)
        lookup = {c: k for k, c in enumerate(classes)}
        y = np.asarray([lookup[v] for v in raw_t], dtype=np.int64)
    ds = TensorDataset(x, y)
    ds.feature_names = [header[i] for i in feats]  # type: ignore[attr-defined]
    ds.target_column, ds.classes, ds.task = target_column, classes, task  # type: ignore[attr-defined]
    return ds


# --- image folders ---------------------------------------------------------------------------------------------

class ImageFolder(Dataset):
    """``root/<class>/<image>``: classes are the sorted subfolder names; images load lazily with Pillow.

    Items: (float32 CHW image in [0, 1], int64 class index). ``mode=None`` keeps grayscale ("L") images as one
    channel and converts everything else to RGB; pass ``mode="L"`` or ``"RGB"`` to force one.
    """

    def __init__(self, root: Any, size: int | tuple[int, int] | None = None, mode: str | None = None,
                 transform: Callable[[np.ndarray], Any] | None = None) -> None:
        if mode not in (None, "L", "RGB"):
            raise ValueRangeError(f"image_folder: mode must be None, 'L' or 'RGB', got {mode!r}")
        self.root = _require(root, "image folder (root/<class>/<image files>)")
        if not self.root.is_dir():
            raise DatasetFormatError(f"image_folder: {str(self.root)!r} is a file, expected a folder of class "
                                     "subfolders")
        self.classes = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if not self.classes:
            raise DatasetFormatError(f"image_folder: {str(self.root)!r} has no class subfolders (expected "
                                     "root/<class>/<image files>)")
        self.class_to_idx = {c: k for k, c in enumerate(self.classes)}
        self.samples: list[tuple[Path, int]] = []
        for c in self.classes:
            files = sorted(f for f in (self.root / c).iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS)
            self.samples.extend((f, self.class_to_idx[c]) for f in files)
        if not self.samples:
            raise DatasetFormatError(f"image_folder: no image files ({', '.join(IMAGE_EXTENSIONS)}) under class "
                                     f"folders of {str(self.root)!r}")
        self.size = (size, size) if isinstance(size, int) else (tuple(size) if size is not None else None)
        self.mode = mode
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, path: Path) -> np.ndarray:
        """One image as a float32 CHW array in [0, 1]."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as im:
                mode = self.mode or ("L" if im.mode in ("L", "1") else "RGB")
                im = im.convert(mode)
                if self.size is not None:
                    h, w = self.size
                    im = im.resize((w, h), Image.Resampling.BILINEAR)
                a = np.asarray(im, dtype=np.float32) / np.float32(255.0)
        except (UnidentifiedImageError, OSError) as e:
            raise DatasetFormatError(f"image_folder: cannot read image {str(path)!r}: {e}") from None
        return a[None] if a.ndim == 2 else np.ascontiguousarray(a.transpose(2, 0, 1))

    def __getitem__(self, index: int) -> tuple[Any, np.int64]:
        path, label = self.samples[index]
        x = self.load(path)
        if self.transform is not None:
            x = self.transform(x)
        return x, np.int64(label)


def image_folder(root: Any, size: int | tuple[int, int] | None = None, mode: str | None = None,
                 transform: Callable[[np.ndarray], Any] | None = None) -> ImageFolder:
    """An :class:`ImageFolder` over ``root`` (see there)."""
    return ImageFolder(root, size=size, mode=mode, transform=transform)


__all__ = [
    "digits",
    "synthetic_regression",
    "synthetic_sequences",
    "read_idx",
    "write_idx",
    "mnist_idx",
    "csv_dataset",
    "ImageFolder",
    "image_folder",
    "IMAGE_EXTENSIONS",
]
