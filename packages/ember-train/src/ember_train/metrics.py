"""Training metrics: accuracy, top-k accuracy, macro F1, running averages, throughput and learning rate.

The functions take ember Tensors or numpy arrays (logits ``(N, C)`` or ``(N, C, ...)``, integer targets ``(N,)``
or ``(N, ...)``) and return Python floats. :class:`EpochMetrics` accumulates them over an epoch without keeping the
predictions: accuracy and top-k as counts, F1 as a confusion matrix, so the epoch value is exact.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ember import Tensor
from ember.errors import ShapeError, ValueRangeError

__all__ = [
    "accuracy",
    "evaluate_accuracy",
    "top_k_accuracy",
    "f1_score",
    "learning_rate",
    "RunningAverage",
    "Throughput",
    "EpochMetrics",
    "parse_metric",
    "KNOWN_METRICS",
]

KNOWN_METRICS = ("loss", "accuracy", "top{k}_accuracy", "f1", "lr", "samples_per_sec")
_TOPK = re.compile(r"^top_?(\d+)(?:_accuracy)?$")


def _np(x: Any) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().numpy()
    return np.asarray(x)


def _flat_logits(logits: Any, targets: Any, op: str) -> tuple[np.ndarray, np.ndarray]:
    """Logits as ``(M, C)`` and targets as ``(M,)``; class dim 1 is moved last, like cross_entropy's layout."""
    lg, tg = _np(logits), _np(targets)
    if lg.ndim < 2:
        raise ShapeError(f"{op}: expected logits of shape (N, C) or (N, C, ...), got shape {lg.shape}")
    if tg.shape != (lg.shape[0], *lg.shape[2:]):
        raise ShapeError(f"{op}: targets of shape {tg.shape} do not match logits of shape {lg.shape} "
                         f"(expected targets {(lg.shape[0], *lg.shape[2:])})")
    if lg.ndim > 2:
        lg = np.moveaxis(lg, 1, -1)
    return lg.reshape(-1, lg.shape[-1]), tg.reshape(-1).astype(np.int64)


def accuracy(logits: Any, targets: Any) -> float:
    """Fraction of samples whose arg-max class equals the target."""
    lg, tg = _flat_logits(logits, targets, "accuracy")
    return float((lg.argmax(axis=1) == tg).mean()) if tg.size else float("nan")


def evaluate_accuracy(model: Any, loader: Iterable[Any]) -> float:
    """The fraction of ``(x, y)`` batches' samples whose arg-max class is the target, with the model in eval mode
    and no gradients recorded (0.0 for an empty loader). The model is left in eval mode."""
    from ember import no_grad

    model.eval()
    correct = seen = 0
    with no_grad():
        for x, y in loader:
            lg, tg = _flat_logits(model(x), y, "evaluate_accuracy")
            correct += int((lg.argmax(axis=1) == tg).sum())
            seen += tg.size
    return correct / seen if seen else 0.0


def _topk_hits(lg: np.ndarray, tg: np.ndarray, k: int, op: str) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueRangeError(f"{op}: k must be a positive int, got {k!r}")
    if k >= lg.shape[1]:
        return int(tg.size)  # every class is in the top k
    top = np.argpartition(-lg, k - 1, axis=1)[:, :k]
    return int((top == tg[:, None]).any(axis=1).sum())


def top_k_accuracy(logits: Any, targets: Any, k: int = 5) -> float:
    """Fraction of samples whose target is among the ``k`` highest logits."""
    lg, tg = _flat_logits(logits, targets, "top_k_accuracy")
    return _topk_hits(lg, tg, k, "top_k_accuracy") / tg.size if tg.size else float("nan")


def _macro_f1(confusion: np.ndarray) -> float:
    """Macro F1 over the classes that occur in the targets or the predictions (scikit-learn's default labels)."""
    tp = np.diag(confusion).astype(np.float64)
    pred = confusion.sum(axis=0)
    true = confusion.sum(axis=1)
    present = (pred + true) > 0
    if not present.any():
        return float("nan")
    denom = pred + true
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return float(f1[present].mean())


def _confusion(pred: np.ndarray, tg: np.ndarray, num_classes: int) -> np.ndarray:
    return np.bincount(tg * num_classes + pred, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def f1_score(logits: Any, targets: Any, num_classes: int | None = None) -> float:
    """Macro-averaged F1 of the arg-max predictions (classes absent from both targets and predictions are left out).

    ``logits`` may also be integer class predictions of the same shape as ``targets``.
    """
    lg, tg = _np(logits), _np(targets)
    if lg.shape == tg.shape and lg.dtype.kind in "iub":
        pred, tg = lg.reshape(-1).astype(np.int64), tg.reshape(-1).astype(np.int64)
        n = int(max(pred.max(initial=-1), tg.max(initial=-1)) + 1)
    else:
        lg2, tg = _flat_logits(lg, tg, "f1_score")
        pred, n = lg2.argmax(axis=1), lg2.shape[1]
    n = max(n, num_classes or 0)
    if tg.size and (tg.min() < 0 or tg.max() >= n):
        raise ValueRangeError(f"f1_score: targets range over [{tg.min()}, {tg.max()}], expected 0..{n - 1}")
    return _macro_f1(_confusion(pred, tg, n))


def learning_rate(optimizer: Any) -> float:
    """The learning rate of the optimizer's first parameter group."""
    try:
        lr = optimizer.param_groups[0]["lr"]
    except (AttributeError, IndexError, KeyError, TypeError):
        raise ValueRangeError(f"learning_rate: {type(optimizer).__name__} has no param_groups[0]['lr']") from None
    if isinstance(lr, Tensor) and lr.numel() == 1:
        lr = lr.item()
    if not isinstance(lr, (int, float, np.number)) or isinstance(lr, bool):
        raise ValueRangeError(f"learning_rate: param_groups[0]['lr'] of {type(optimizer).__name__} is "
                              f"{lr!r:.60}, not a number")
    return float(lr)


class RunningAverage:
    """A weighted running mean (``update(value, weight)``); ``value`` is NaN until something was added."""

    def __init__(self) -> None:
        self.total = 0.0
        self.weight = 0.0

    def update(self, value: float, weight: float = 1.0) -> None:
        self.total += float(value) * weight
        self.weight += weight

    @property
    def value(self) -> float:
        return self.total / self.weight if self.weight else float("nan")

    def reset(self) -> None:
        self.total = 0.0
        self.weight = 0.0


class Throughput:
    """Samples per second over wall-clock time since ``start()`` (or construction)."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.samples = 0

    def update(self, n: int) -> None:
        self.samples += int(n)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def value(self) -> float:
        dt = self.elapsed
        return self.samples / dt if dt > 0 else 0.0


def parse_metric(name: str) -> tuple[str, int]:
    """``"top5"`` / ``"top5_accuracy"`` -> ``("topk", 5)``; other known names -> ``(name, 0)``."""
    if not isinstance(name, str):
        raise ValueRangeError(f"metrics: metric names must be strings, got {type(name).__name__}")
    m = _TOPK.match(name)
    if m:
        k = int(m.group(1))
        if k < 1:
            raise ValueRangeError(f"metrics: {name!r}: k must be at least 1")
        return "topk", k
    if name in ("loss", "accuracy", "f1", "lr", "samples_per_sec"):
        return name, 0
    raise ValueRangeError(f"metrics: unknown metric {name!r}; known: {', '.join(KNOWN_METRICS)}")


class EpochMetrics:
    """Accumulates loss and classification metrics over one pass (train or valid).

    ``update(loss, n, logits, targets)``: ``loss`` is the batch's mean loss and ``n`` its sample count; logits and
    targets (numpy) are only used when the task is classification (integer targets, logits with a class dim).
    """

    def __init__(self, metrics: Sequence[str]) -> None:
        self.names = list(metrics)
        parsed = [parse_metric(m) for m in self.names]
        self.ks = sorted({k for kind, k in parsed if kind == "topk"})
        self.want_acc = any(kind == "accuracy" for kind, _ in parsed)
        self.want_f1 = any(kind == "f1" for kind, _ in parsed)
        self.loss = RunningAverage()
        self.count = 0
        self.correct = 0
        self.topk = dict.fromkeys(self.ks, 0)
        self.confusion: np.ndarray | None = None
        self.classification = False

    @property
    def needs_outputs(self) -> bool:
        return self.want_acc or self.want_f1 or bool(self.ks)

    def update(self, loss: float, n: int, logits: np.ndarray | None = None, targets: np.ndarray | None = None
               ) -> None:
        self.loss.update(loss, n)
        if logits is None or targets is None or not self.needs_outputs:
            return
        if targets.dtype.kind not in "iu" or logits.ndim < 2 or logits.dtype.kind != "f":
            return  # regression: classification metrics do not apply
        lg, tg = _flat_logits(logits, targets, "metrics")
        self.classification = True
        self.count += tg.size
        pred = lg.argmax(axis=1)
        self.correct += int((pred == tg).sum())
        for k in self.ks:
            self.topk[k] += _topk_hits(lg, tg, k, "metrics")
        if self.want_f1:
            c = lg.shape[1]
            valid = (tg >= 0) & (tg < c)  # ignore_index targets are left out
            cm = _confusion(pred[valid], tg[valid], c)
            self.confusion = cm if self.confusion is None else self.confusion + cm

    def compute(self, prefix: str) -> dict[str, float]:
        """The epoch's values as ``{prefix + "_loss": ..., prefix + "_accuracy": ...}``."""
        out = {f"{prefix}_loss": self.loss.value}
        if self.classification and self.count:
            if self.want_acc:
                out[f"{prefix}_accuracy"] = self.correct / self.count
            for k in self.ks:
                out[f"{prefix}_top{k}_accuracy"] = self.topk[k] / self.count
            if self.want_f1 and self.confusion is not None:
                out[f"{prefix}_f1"] = _macro_f1(self.confusion)
        return out


def metric_names(metrics: Iterable[str], prefix: str) -> list[str]:
    """The record keys ``EpochMetrics.compute(prefix)`` can produce for these metric names."""
    names = [f"{prefix}_loss"]
    for m in metrics:
        kind, k = parse_metric(m)
        if kind == "accuracy":
            names.append(f"{prefix}_accuracy")
        elif kind == "topk":
            names.append(f"{prefix}_top{k}_accuracy")
        elif kind == "f1":
            names.append(f"{prefix}_f1")
    return names
