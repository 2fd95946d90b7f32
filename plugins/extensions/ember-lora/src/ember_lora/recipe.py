"""``ember train lora``: pre-train the seed transformer on one synthetic task, then fine-tune it on a second task
three ways -- every weight (full fine-tune), LoRA adapters, and LoRA on an NF4-quantized base (QLoRA) -- and
print, side by side, the trainable fraction, the memory of the weights and of one training step, the step time,
the accuracy on the new task and what is left of the old one.

ember-train finds this recipe through its entry-point group ``ember_train.recipes`` (``lora =
"ember_lora.recipe:RECIPE"``); nothing here is imported unless ``ember train lora`` runs, and ember-lora itself never
needs ember-train.

The two tasks (:func:`tasks`) come from ``ember_train.datasets.synthetic_sequences``: task A is the generator as is
(each class owns a block of marker tokens planted in noise); task B plants the same marker tokens but deals them
out to the classes anew (a seeded permutation of the marker tokens), so a model that learned A attends to the right
tokens but reads the wrong class from them: B has to be learned, and learning it overwrites A in a full fine-tune.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import ember
from ember import nn
from ember_train.cli import Defaults, Recipe, Settings
from ember_train.data import DataLoader, TensorDataset
from ember_train.datasets import synthetic_sequences
from ember_train.learner import Callback, Learner
from ember_train.metrics import evaluate_accuracy
from ember_train.models import TextTransformer, text_transformer

from .config import LoraConfig
from .model import apply_lora, disable_adapters, lora_param_groups, trainable_parameters
from .qlora import apply_qlora

__all__ = ["RECIPE", "MethodResult", "Sizes", "sizes", "tasks", "run_example", "format_table", "train_lora"]

METHODS = ("full", "lora", "qlora")
_MiB = 1024 * 1024


@dataclass(frozen=True)
class Sizes:
    """Task and model sizes of one run (see :func:`sizes`)."""

    n: int
    seq_len: int
    vocab: int
    classes: int
    model: dict[str, Any]
    rank: int


def sizes(quick: bool) -> Sizes:
    """The default run: the seed transformer's small configuration (2 layers of width 128) on sequences of 32 over a
    vocabulary of 128; ``quick``: 1 layer of width 32 on sequences of 16 (tests and CI, a few seconds)."""
    if quick:
        return Sizes(512, 16, 64, 4, {"d_model": 32, "nhead": 4, "dim_feedforward": 64, "num_layers": 1}, 8)
    return Sizes(1600, 32, 128, 4, {}, 8)


def tasks(size: Sizes, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(tokens, labels)`` of task A and task B (module docstring): B deals A's marker tokens to the classes anew."""
    a = synthetic_sequences(size.n, size.seq_len, size.vocab, size.classes, seed)
    b = synthetic_sequences(size.n, size.seq_len, size.vocab, size.classes, seed + 1)
    markers = a.markers.size  # type: ignore[attr-defined]
    # marker tokens are 1..markers; a permutation of them regroups the markers into new classes
    perm = np.arange(size.vocab)
    perm[1:1 + markers] = 1 + np.random.default_rng(seed + 2).permutation(markers)
    xb, yb = b.arrays
    return a.arrays, (perm[xb], yb)


@dataclass
class MethodResult:
    """One row of the table: figures of one fine-tuning method."""

    method: str
    trainable: int
    total: int
    trainable_fraction: float
    weights_bytes: int
    step_peak_bytes: int
    step_rss_bytes: int | None
    pool_kept_bytes: int | None
    step_ms: float | None
    accuracy_b: float
    accuracy_a: float
    accuracy_a_base: float | None

    def row(self) -> list[str]:
        """The row as printed by :func:`format_table`."""
        def mib(v: int | None) -> str:
            return "n/a" if v is None else f"{v / _MiB:.2f}"

        base = "" if self.accuracy_a_base is None else f" ({self.accuracy_a_base:.1%} off)"
        step = "n/a" if self.step_ms is None else f"{self.step_ms:.1f}"
        return [self.method, f"{self.trainable:,d}", f"{self.trainable_fraction:.2%}", mib(self.weights_bytes),
                mib(self.step_peak_bytes), mib(self.step_rss_bytes), mib(self.pool_kept_bytes), step,
                f"{self.accuracy_b:.1%}", f"{self.accuracy_a:.1%}{base}"]


HEADER = ["method", "trainable", "trainable %", "weights MiB", "step peak MiB", "RSS growth MiB", "pool kept MiB",
          "step ms", "acc B", "acc A after"]


def format_table(rows: list[MethodResult], pretrained: tuple[float, float]) -> str:
    """The results as an aligned text table, with the pre-trained model's accuracies and what the columns mean."""
    cells = [HEADER, *[r.row() for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"pre-trained on A: acc A {pretrained[0]:.1%}, acc B {pretrained[1]:.1%}")
    lines.append("weights: stored parameters and buffers (NF4 packed for QLoRA); step peak: memory allocated during "
                 "the first fine-tuning step (traced host allocations: graph, gradients, optimizer state); RSS growth: "
                 "the process's peak resident-set growth over that step; pool kept: what the step left allocated "
                 "in the device pool (gradients, optimizer state; n/a without a pool); step ms: mean training step "
                 "(n/a when a resumed phase had no step left); acc A after: the fine-tuned model on task A (in "
                 "brackets: adapters switched off)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------------------
def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux: ``5`` into ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextmanager
def _memory_probe(device: ember.Device) -> Iterator[dict[str, int | None]]:
    """Measure the block: traced peak allocation (tracemalloc sees numpy's buffers), peak RSS growth (Linux) and the
    growth of the device pool's in-use bytes where the backend reports them (filled in once the block exits). The
    contract has no way to restart a pool's peak, so the pool figure is what the block leaves allocated."""
    out: dict[str, int | None] = {"traced": 0, "rss": None, "pool": None}
    pool_before = _pool_in_use(device)
    rss_ok = _reset_peak_rss()
    before = _status_bytes("VmRSS")
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield out
    finally:
        out["traced"] = max(tracemalloc.get_traced_memory()[1] - base, 0)
        if not was_tracing:
            tracemalloc.stop()
        peak = _status_bytes("VmHWM")
        if rss_ok and before is not None and peak is not None:
            out["rss"] = max(peak - before, 0)
        pool_after = _pool_in_use(device)
        if pool_before is not None and pool_after is not None:
            out["pool"] = max(pool_after - pool_before, 0)


def _pool_in_use(device: ember.Device) -> int | None:
    """Bytes in use in the device's memory pool (``memory_report()["in_use"]``); None where there is no pool."""
    try:
        in_use = device.memory_report().get("in_use")
    except ember.EmberError:
        return None
    return None if in_use is None else int(in_use)


def _weights_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers as stored (a 4-bit base counts its packed bytes and scales)."""
    return sum(t.numel() * t.dtype.itemsize for t in model.state_dict().values())


class _StepTimer(Callback):
    """Mean time between training steps, the first of each epoch left out (it includes the loader's start)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last: float | None = None
        self._epoch = -1

    def on_step_end(self, learner: Learner, epoch: int, step: int, metrics: Any) -> None:
        now = time.perf_counter()
        if epoch == self._epoch and self._last is not None:
            self.times.append(now - self._last)
        self._epoch, self._last = epoch, now

    def on_epoch_end(self, learner: Learner, record: Any) -> None:
        self._last = None  # validation runs between epochs

    @property
    def mean_ms(self) -> float | None:
        """Mean step time in milliseconds; None when no step ran (a resumed run that had finished)."""
        return 1000 * float(np.mean(self.times)) if self.times else None


# ----------------------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------------------
def _loaders(data: tuple[np.ndarray, np.ndarray], s: Settings) -> tuple[DataLoader, DataLoader]:
    x, y = data
    k = int(0.8 * len(y))  # the generator's samples are i.i.d.: the first 80 % train, the rest validate
    train = DataLoader(TensorDataset(x[:k], y[:k]), batch_size=s.batch_size, shuffle=True, seed=s.seed,
                       device=s.device)
    return train, DataLoader(TensorDataset(x[k:], y[k:]), batch_size=256, device=s.device)


def _model(size: Sizes, s: Settings) -> TextTransformer:
    ember.manual_seed(s.seed, s.device)
    return text_transformer("small", num_classes=size.classes, vocab_size=size.vocab, max_len=size.seq_len,
                            **size.model).to(s.device)


def _fit(s: Settings, phase: str, model: nn.Module, optimizer: Any, train: DataLoader, valid: DataLoader,
         timer: Callback | None = None, scheduler: Any = None) -> Any:
    learner = Learner(model, train, valid, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=scheduler,
                      metrics=("loss", "accuracy"), device=s.device, out_dir=os.path.join(s.out, phase),
                      best_metric="valid_accuracy", best_mode="max", dashboard=s.dashboard, seed=s.seed,
                      callbacks=() if timer is None else (timer,))
    return learner.fit(s.epochs, resume="latest" if s.resume else None, overwrite=s.overwrite)


def _lora_config(size: Sizes) -> LoraConfig:
    # every Linear: the feed-forward layers and the attention's q/k/v/out projections; the new task's head trains as
    # a full copy. Biases stay frozen, so with the adapters switched off the model is exactly the pre-trained one (or
    # its NF4 twin)
    return LoraConfig(r=size.rank, lora_alpha=2 * size.rank, target_modules="all-linear", modules_to_save=["head"])


def _fine_tune(s: Settings, size: Sizes, method: str, pretrained: dict[str, Any], a_valid: DataLoader,
               b_train: DataLoader, b_valid: DataLoader, lr: float) -> tuple[MethodResult, bool]:
    model = _model(size, s)
    model.load_state_dict(pretrained)
    if method == "full":
        params: Any = model.parameters()
    else:
        (apply_lora if method == "lora" else apply_qlora)(model, _lora_config(size))
        params = lora_param_groups(model, lr)
    trainable, total = trainable_parameters(model) if method != "full" else (
        sum(p.numel() for p in model.parameters()),) * 2
    optimizer = ember.optim.AdamW(params, lr=lr, weight_decay=0.0)
    loss_fn = nn.CrossEntropyLoss()
    # the first fine-tuning step, measured: forward, backward and the optimizer's step (which allocates its state)
    x, y = next(iter(b_train))
    model.train()
    with _memory_probe(s.device) as mem:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    timer = _StepTimer()
    # every fine-tuning run anneals its rate to zero over its steps (cosine): at the adapters' higher rate a constant
    # one let LoRA on the attention projections overshoot in the last epochs
    schedule = ember.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(s.epochs * len(b_train), 1))
    history = _fit(s, method, model, optimizer, b_train, b_valid, timer, schedule)
    off = None
    if method != "full":
        with disable_adapters(model):
            off = evaluate_accuracy(model, a_valid)
    result = MethodResult(method, trainable, total, trainable / total, _weights_bytes(model), int(mem["traced"] or 0),
                          mem["rss"], mem["pool"], timer.mean_ms, evaluate_accuracy(model, b_valid),
                          evaluate_accuracy(model, a_valid), off)
    return result, bool(history.interrupted)


def run_example(s: Settings) -> tuple[list[MethodResult], tuple[float, float], bool]:
    """Pre-train on task A, fine-tune on B with each of :data:`METHODS`; returns the rows, the pre-trained model's
    (acc A, acc B) and whether Ctrl-C interrupted. Each phase's checkpoints and logs go to ``s.out/<phase>``."""
    size = sizes(s.quick)
    data_a, data_b = tasks(size, s.seed)
    a_train, a_valid = _loaders(data_a, s)
    b_train, b_valid = _loaders(data_b, s)
    model = _model(size, s)
    print(f"ember train lora: pre-training on task A ({len(a_train.dataset)} sequences of {size.seq_len}, "
          f"{size.classes} classes)", flush=True)
    history = _fit(s, "pretrain", model, ember.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.01),
                   a_train, a_valid)
    pre = (evaluate_accuracy(model, a_valid), evaluate_accuracy(model, b_valid))
    if history.interrupted:
        return [], pre, True
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows: list[MethodResult] = []
    for method in METHODS:
        # adapters learn at a higher rate than full fine-tuning (a zero-initialised low-rank update, as in PEFT)
        lr = s.lr if method == "full" else 3 * s.lr
        print(f"ember train lora: fine-tuning on task B: {method}, lr {lr:g}", flush=True)
        row, interrupted = _fine_tune(s, size, method, state, a_valid, b_train, b_valid, lr)
        rows.append(row)
        if interrupted:
            return rows, pre, True
    return rows, pre, False


def train_lora(s: Settings) -> tuple[str, bool]:
    """The ``ember train lora`` recipe: runs :func:`run_example`, prints the table and writes it as JSON to
    ``s.out/lora-results.json``; returns the CLI's summary line."""
    rows, pre, interrupted = run_example(s)
    if rows:
        print(format_table(rows, pre), flush=True)
        os.makedirs(s.out, exist_ok=True)
        with open(os.path.join(s.out, "lora-results.json"), "w") as f:
            json.dump({"pretrained": {"accuracy_a": pre[0], "accuracy_b": pre[1]},
                       "methods": [asdict(r) for r in rows]}, f, indent=2)
    accs = ", ".join(f"{r.method} {r.accuracy_b:.1%}" for r in rows) or "n/a"
    chance = 1 / sizes(s.quick).classes
    return f"task B validation accuracy: {accs} (chance {chance:.0%})", interrupted


#: the entry point ember-train loads for ``ember train lora`` (group ``ember_train.recipes``)
RECIPE = Recipe("lora", Defaults(4, 32, 3e-3, quick_epochs=6, quick_batch_size=32,
                                 help="pre-train the seed transformer on one task, fine-tune on another: full, "
                                      "LoRA and QLoRA side by side"), train_lora)
