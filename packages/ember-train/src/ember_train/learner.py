"""``Learner``: the training loop (train + validation), checkpoints, exact resume, early stopping, logs, dashboard.

>>> learner = Learner(model, train_loader, valid_loader, loss_fn=nn.CrossEntropyLoss(), optimizer=opt,
...                   out_dir="runs/digits")                                             # doctest: +SKIP
>>> history = learner.fit(10)                                                           # doctest: +SKIP
>>> history.best                                                                        # doctest: +SKIP
{'epoch': 9, 'metric': 'valid_accuracy', 'value': 0.981}

Reproducibility: at the start of epoch ``e`` (0-based) the device's random stream is reseeded with ``seed + e``
and the loader's ``set_epoch(e)`` fixes its data order, so the run is a pure function of (seed, epoch). A run
resumed from the checkpoint of epoch ``e`` therefore reproduces the uninterrupted run bit for bit.

Whole-step replay: with ``compile=True`` (the default) each training step -- forward, loss, backward, gradient
clipping, optimizer update and ``zero_grad`` -- runs through :func:`ember.compile`: the first steps run eagerly
while recording, later steps with the same batch shape replay the recorded kernels (bit for bit as eager on flex).
A step that cannot be replayed (a graph break, a distributed strategy) runs eagerly and the Learner says why once;
``compile=False`` or ``EMBER_REPLAY=0`` in the environment turns replay off.

Mixed precision: ember core has no autocast yet, so ``mixed_precision=True`` raises ``UnsupportedError`` at
construction on every device (on flex float16/bfloat16 are emulated through numpy and would only be slower). When
core grows ``ember.autocast(device, dtype)`` the forward runs under it on devices that support the half dtype.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

import ember
from ember import Tensor
from ember.errors import DTypeError, EmberError, UnsupportedError, ValueRangeError

from . import checkpoint as ckpt
from .dashboard import Dashboard, make_dashboard
from .data import DataLoader
from .metrics import EpochMetrics, Throughput, learning_rate, metric_names, parse_metric

__all__ = ["Learner", "History", "OutputDirError", "Callback", "Strategy", "STRATEGY_GROUP", "resolve_strategy"]

_TIMING_KEYS = ("samples_per_sec", "epoch_time")

#: ``ember bench compile`` (entry-point group ``ember.benchmarks``): the Learner's step eager vs replayed
COMPILE_BENCHMARK = {
    "description": "seed-CNN training step eager vs captured and replayed (ember.compile) on flex and OpenCL",
    "script": "compile.py",
}


class OutputDirError(EmberError, OSError):
    """The output directory cannot be created or written."""


class Callback:
    """Hooks called by :meth:`Learner.fit`; override the ones you need (raising KeyboardInterrupt stops cleanly)."""

    def on_step_end(self, learner: Learner, epoch: int, step: int, metrics: Mapping[str, float]) -> None:
        """After each optimizer step (``step`` 1-based within the 0-based ``epoch``)."""

    def on_epoch_end(self, learner: Learner, record: Mapping[str, Any]) -> None:
        """After each epoch's validation and checkpoint."""


class History:
    """Per-epoch metric records of a fit, the best epoch, and how the fit ended.

    Dict-like over metric names: ``history["valid_accuracy"]`` is the list of per-epoch values (None where an
    epoch lacks the metric); ``history.epochs`` is the list of record dicts.
    """

    def __init__(self, best_metric: str, best_mode: str) -> None:
        self.epochs: list[dict[str, Any]] = []
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.best_epoch: int | None = None
        self.best_value: float | None = None
        self.interrupted = False
        self.stopped_early = False
        self.elapsed = 0.0

    @property
    def best(self) -> dict[str, Any] | None:
        """``{"epoch", "metric", "value"}`` of the best epoch so far (None before the first epoch)."""
        if self.best_epoch is None:
            return None
        return {"epoch": self.best_epoch, "metric": self.best_metric, "value": self.best_value}

    def best_record(self) -> dict[str, Any] | None:
        for r in self.epochs:
            if r["epoch"] == self.best_epoch:
                return r
        return None

    def improves(self, value: float) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value > self.best_value if self.best_mode == "max" else value < self.best_value

    def keys(self) -> list[str]:
        out: list[str] = []
        for r in self.epochs:
            out += [k for k in r if k not in out]
        return out

    def __getitem__(self, key: str) -> list[Any]:
        if key not in self.keys():
            raise KeyError(f"History has no metric {key!r}; it has {self.keys()}")
        return [r.get(key) for r in self.epochs]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Any:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.epochs)

    def summary(self) -> str:
        how = "interrupted" if self.interrupted else "stopped early" if self.stopped_early else "finished"
        last = self.epochs[-1]["epoch"] if self.epochs else 0
        best = (f"best {self.best_metric} {self.best_value:.4f} at epoch {self.best_epoch}"
                if self.best_epoch is not None else "no completed epoch")
        return f"training {how} after epoch {last} in {self.elapsed:.1f}s; {best}"

    def __repr__(self) -> str:
        return f"History({len(self.epochs)} epochs, best={self.best}, interrupted={self.interrupted})"

    def _state(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "best_epoch": self.best_epoch, "best_value": self.best_value,
                "elapsed": self.elapsed}

    def _load(self, state: Mapping[str, Any]) -> None:
        self.epochs = [dict(r) for r in state["epochs"]]
        self.best_epoch, self.best_value = state["best_epoch"], state["best_value"]
        self.elapsed = float(state.get("elapsed", 0.0))


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


# -- strategies: how a fit spreads over processes ---------------------------------------------------------------------

#: entry-point group of training strategies: ``Learner(strategy="ddp")`` loads the entry point named ``ddp`` (a
#: class whose instances follow :class:`Strategy`, made with no arguments). ember-train never imports the packages
#: that provide them; ember-distributed provides ``ddp``.
STRATEGY_GROUP = "ember_train.strategies"

#: strategies of optional first-party packages, named in the error when the package is missing: name -> (dist, extra)
OPTIONAL_STRATEGIES = {"ddp": ("ember-distributed", "distributed")}


class Strategy:
    """A single process (the default). A strategy decides what the Learner's forward/backward run through, which
    process writes logs, checkpoints and the dashboard, and how per-process epoch metrics combine.

    * ``setup(learner)`` returns the module the training step calls (a data-parallel wrapper of
      ``learner.model``); it may also adjust ``learner.train_loader`` (a per-rank shard). ``learner.model`` stays
      the plain model: checkpoints hold its state, so they load in any strategy.
    * ``is_main``: this process logs, checkpoints and shows the dashboard.
    * ``reduce_metrics(record)``: the epoch record combined over processes (the same on every one).
    * ``broadcast_object(obj)``: the main process's ``obj`` on every process (run ids, resume paths).
    * ``barrier()``: wait for every process (before others read a checkpoint the main one wrote).
    """

    name = "single"
    is_main = True

    def setup(self, learner: Learner) -> Any:
        """The module the training step runs (the plain model here)."""
        return learner.model

    def reduce_metrics(self, record: dict[str, Any]) -> dict[str, Any]:
        """One process: the record as it is."""
        return record

    def broadcast_object(self, obj: Any) -> Any:
        """One process: ``obj`` itself."""
        return obj

    def barrier(self) -> None:
        """One process: nothing to wait for."""


def resolve_strategy(strategy: str | Strategy | None) -> Strategy:
    """A Strategy instance: None is the single-process one, a name is looked up in :data:`STRATEGY_GROUP`."""
    if strategy is None or strategy == "single":
        return Strategy()
    if not isinstance(strategy, str):
        if all(hasattr(strategy, a) for a in ("setup", "is_main", "reduce_metrics", "broadcast_object", "barrier")):
            return strategy
        raise DTypeError(f"Learner: strategy must be a name, a Strategy or None, got {type(strategy).__name__}")
    from importlib import metadata

    from ember.errors import MissingPluginError

    eps = [ep for ep in metadata.entry_points(group=STRATEGY_GROUP) if ep.name == strategy]
    if not eps:
        known = sorted({ep.name for ep in metadata.entry_points(group=STRATEGY_GROUP)} | {"single"})
        if strategy in OPTIONAL_STRATEGIES:
            dist, extra = OPTIONAL_STRATEGIES[strategy]
            raise MissingPluginError(f"Learner: strategy {strategy!r} comes from {dist}, which is not installed; "
                                     f"pip install 'ember[{extra}]' (installed strategies: {', '.join(known)})")
        raise ValueRangeError(f"Learner: unknown strategy {strategy!r}; installed strategies: {', '.join(known)}")
    return eps[0].load()()


class Learner:
    """Fit ``model`` on ``train_loader`` (batches ``(x, y)`` of ember tensors), validating on ``valid_loader``.

    ``loss_fn(output, y)`` must return the batch's *mean* loss (the default reduction); gradient accumulation
    weights each micro-batch by its sample count so ``grad_accum_steps=k`` equals one batch k times larger.
    ``scheduler_interval="step"`` steps the scheduler after every optimizer step, ``"epoch"`` after every epoch.
    ``metrics`` names: ``loss``, ``accuracy``, ``top{k}`` / ``top{k}_accuracy``, ``f1`` (macro); the learning
    rate at the start of the epoch (``lr``), training ``samples_per_sec`` and ``epoch_time`` (train + validation)
    are always recorded, and ``grad_norm`` (mean norm before clipping) when ``clip_grad_norm`` is set.
    ``strategy``: None (one process) or a :class:`Strategy` / the name of one from :data:`STRATEGY_GROUP`:
    ``"ddp"`` (ember-distributed) trains data-parallel under ``mpiexec``/``ember launch``, each rank on its shard
    of the training set, logs and checkpoints on rank 0 only, and records metrics averaged over ranks.
    """

    def __init__(self, model: Any, train_loader: Iterable[Any], valid_loader: Iterable[Any] | None = None, *,
                 loss_fn: Callable[[Any, Any], Tensor], optimizer: Any, scheduler: Any = None,
                 scheduler_interval: str = "step", metrics: Sequence[str] = ("loss", "accuracy"),
                 device: Any = None, grad_accum_steps: int = 1, clip_grad_norm: float | None = None,
                 mixed_precision: bool = False, out_dir: str | os.PathLike[str] | None = None,
                 keep_last: int | None = 2, best_metric: str = "valid_accuracy", best_mode: str = "max",
                 early_stopping_patience: int | None = None, dashboard: str | Dashboard = "auto", seed: int = 0,
                 log_every: int | None = None, callbacks: Sequence[Callback] = (), console: Any = None,
                 strategy: str | Strategy | None = None, compile: bool = True) -> None:
        if not callable(loss_fn):
            raise DTypeError(f"Learner: loss_fn must be callable, got {type(loss_fn).__name__}")
        if scheduler_interval not in ("step", "epoch"):
            raise ValueRangeError(f"Learner: scheduler_interval must be 'step' or 'epoch', got {scheduler_interval!r}")
        for name, v, low in (("grad_accum_steps", grad_accum_steps, 1), ("seed", seed, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueRangeError(f"Learner: {name} must be an int >= {low}, got {v!r}")
        if not isinstance(compile, bool):
            raise DTypeError(f"Learner: compile must be a bool, got {type(compile).__name__}")
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueRangeError(f"Learner: keep_last must be a positive int or None, got {keep_last!r}")
        if clip_grad_norm is not None and not (isinstance(clip_grad_norm, (int, float)) and clip_grad_norm > 0):
            raise ValueRangeError(f"Learner: clip_grad_norm must be a positive number or None, got {clip_grad_norm!r}")
        if best_mode not in ("max", "min"):
            raise ValueRangeError(f"Learner: best_mode must be 'max' or 'min', got {best_mode!r}")
        if early_stopping_patience is not None and (not isinstance(early_stopping_patience, int)
                                                    or early_stopping_patience < 0):
            raise ValueRangeError(f"Learner: early_stopping_patience must be an int >= 0 or None, "
                                  f"got {early_stopping_patience!r}")
        self.metrics = list(metrics)
        for m in self.metrics:
            parse_metric(m)
        self.model = model
        self.train_loader = train_loader
        self.valid_loader = valid_loader
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        params = list(model.parameters())
        if device is None:
            device = params[0].device if params else ember.default_device()
        self.device = ember.Device.parse(device) if isinstance(device, str) else device
        if params and any(p.device is not self.device for p in params):
            model.to(self.device)
        self.grad_accum_steps = grad_accum_steps
        self.clip_grad_norm = clip_grad_norm
        self.mixed_precision = mixed_precision
        self._autocast = self._mixed_precision_context(mixed_precision)
        self.out_dir = None if out_dir is None else os.fspath(out_dir)
        self.keep_last = keep_last
        self.best_metric = self._resolve_best_metric(best_metric)
        self.best_mode = best_mode
        self.early_stopping_patience = early_stopping_patience
        self.seed = seed
        self.callbacks = list(callbacks)
        self.strategy = resolve_strategy(strategy)
        # other ranks stay quiet: one dashboard, one set of logs and checkpoints per run
        self.dashboard = make_dashboard(dashboard if self.strategy.is_main else "none", log_every=log_every,
                                        console=console)
        self._train_module = self.strategy.setup(self)
        self.compile = compile
        self._compiled_step, self._compiled_micro = self._make_steps()
        self._compile_reported = False
        self.global_step = 0
        self.history = History(self.best_metric, best_mode)
        self.run_id: str | None = None  # set by fit: new for a fresh run, the checkpoint's for a resumed one

    # -- setup checks ----------------------------------------------------------------------------------------------
    def _mixed_precision_context(self, enabled: bool) -> Callable[[], Any]:
        if not enabled:
            return contextlib.nullcontext
        autocast = getattr(ember, "autocast", None)
        half = next((d for d in ("bfloat16", "float16") if self.device.supports_dtype(d)), None)
        if autocast is None or half is None or self.device.kind == "flex":
            why = ("flex computes float16/bfloat16 in emulation through numpy (slower, not faster)"
                   if self.device.kind == "flex" else
                   "ember core has no autocast" if autocast is None else "the device has no float16/bfloat16")
            raise UnsupportedError(f"Learner: mixed_precision=True is not supported on {self.device}: {why}; "
                                   "train in float32 (mixed_precision=False)")
        return lambda: autocast(self.device, half)  # pragma: no cover - needs a core with autocast

    def _resolve_best_metric(self, name: str) -> str:
        available = metric_names(self.metrics, "train") + ["lr"]
        if self.valid_loader is not None:
            available += metric_names(self.metrics, "valid")
        if name in available:
            return name
        if self.valid_loader is None and name.startswith("valid_") and "train_" + name[6:] in available:
            return "train_" + name[6:]  # no validation set: judge the best epoch on the training metric
        raise ValueRangeError(f"Learner: best_metric {name!r} is not recorded; available: {', '.join(available)}")

    def _check_out_dir(self) -> None:
        if self.out_dir is None:
            return
        probe = os.path.join(self.out_dir, f".ember-train-probe-{os.getpid()}")
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            with open(probe, "w") as f:
                f.write("ok")
            os.remove(probe)
        except OSError as e:
            raise OutputDirError(f"Learner: output directory {self.out_dir!r} is not writable "
                                 f"({type(e).__name__}: {e.strerror or e})") from e

    def _first_batch(self, loader: Any) -> Any:
        """The loader's first batch, leaving the loader's position as it was."""
        state = loader.state_dict() if hasattr(loader, "state_dict") else None
        it = iter(loader)
        try:
            return next(it)
        except StopIteration:
            return None
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
            if state is not None and hasattr(loader, "load_state_dict"):
                loader.load_state_dict(state)

    def _check_batch(self, loader: Any, which: str) -> None:
        """Collate, forward and label-range check on the first batch, before any training."""
        # the loader's own check collates the first batch with a clear error; otherwise peek at it
        batch = loader.check() if hasattr(loader, "check") else self._first_batch(loader)
        if batch is None:
            raise ValueRangeError(f"Learner: the {which} loader yields no batches")
        x, y = self._split(batch, which)
        was_training = self.model.training
        self.model.eval()
        try:
            with ember.no_grad():
                out = self.model(x)
        finally:
            self.model.train(was_training)
        if not (_is_tensor(out) and _is_tensor(y)) or y.dtype.is_floating_point or y.dtype == ember.bool_:
            return
        if not out.dtype.is_floating_point or out.ndim < 2:
            return
        classes = out.shape[1]
        labels = y.numpy()
        ignore = getattr(self.loss_fn, "ignore_index", None)
        if ignore is not None:
            labels = labels[labels != ignore]
        if labels.size and (labels.min() < 0 or labels.max() >= classes):
            raise ValueRangeError(
                f"Learner: labels in the first {which} batch range over [{labels.min()}, {labels.max()}], but the "
                f"model outputs {classes} classes (output shape {tuple(out.shape)}), so "
                f"{type(self.loss_fn).__name__} needs labels in [0, {classes - 1}]")

    def _split(self, batch: Any, which: str = "train") -> tuple[Any, Any]:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            got = f"a {type(batch).__name__}" + (f" of {len(batch)} items" if isinstance(batch, (tuple, list)) else "")
            raise ValueRangeError(f"Learner: {which} batches must be (inputs, targets) pairs, got {got}")
        x, y = batch
        if _is_tensor(x) and x.device is not self.device:
            x = x.to(self.device)
        if _is_tensor(y) and y.device is not self.device:
            y = y.to(self.device)
        return x, y

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _state(self, epoch: int) -> dict[str, Any]:
        loader_state = self.train_loader.state_dict() if hasattr(self.train_loader, "state_dict") else None
        return {
            "format": ckpt.FORMAT,
            "epoch": epoch,
            "seed": self.seed,
            "global_step": self.global_step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "train_loader": loader_state,
            "history": self.history._state(),
            "epochs_since_best": self._since_best,
        }

    def _save(self, epoch: int, is_best: bool) -> None:
        if self.out_dir is None or not self.strategy.is_main:
            return
        state = self._state(epoch)
        ckpt.save_checkpoint(ckpt.checkpoint_path(self.out_dir, epoch), state, self.run_id)
        if is_best:
            ckpt.save_checkpoint(os.path.join(self.out_dir, ckpt.BEST_NAME), state, self.run_id)
        ckpt.rotate_checkpoints(self.out_dir, self.keep_last, self.run_id)

    def _resume_path(self, resume: str | os.PathLike[str]) -> str | None:
        path = os.fspath(resume)
        if path == "latest":  # the newest checkpoint of the run that wrote last (None: start fresh)
            return ckpt.latest_checkpoint(self.out_dir) if self.out_dir else None
        return path

    def _prepare_resume(self, path: str) -> tuple[str, Callable[[], int]]:
        """Read and check everything a resume restores; returns the checkpoint's run id and a function that
        applies it. Nothing changes until that function runs, and it only fails on a foreign loader's own
        load_state_dict, which it runs first."""
        state = ckpt.load_checkpoint(path)
        run_id = ckpt.checkpoint_run_id(path) or ""

        def bad(key: str, why: str) -> ckpt.InvalidCheckpointError:
            return ckpt.InvalidCheckpointError(f"checkpoint {path!r}: {key}: {why}", path, key)

        for key in ("epoch", "global_step", "epochs_since_best", "seed"):
            if key not in state and key in ("epoch", "global_step"):
                raise bad(key, "missing")
            v = state.get(key, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(key, f"is {v!r:.60}; expected an int >= 0")
        epoch = state["epoch"]
        ckpt.check_model_state(self.model, state["model"], path)
        if "optimizer" not in state:
            raise bad("optimizer", "missing")
        opt_state = state["optimizer"]
        check = getattr(self.optimizer, "check_state_dict", None)
        if check is not None:
            try:
                check(opt_state)
            except (EmberError, TypeError, ValueError, KeyError) as e:
                raise bad("optimizer", str(e)) from None
        sched_state = state.get("scheduler")
        check = getattr(self.scheduler, "check_state_dict", None)
        if check is not None:
            groups = opt_state.get("param_groups") if isinstance(opt_state, Mapping) else None
            # a checkpoint without scheduler state keeps this scheduler as it is: it must still work with the
            # optimizer groups about to be loaded (a OneCycleLR needs the initial_lr/max_lr/min_lr it wrote there)
            kept = sched_state is None
            try:
                check(self.scheduler.state_dict() if kept else sched_state, groups)
            except (EmberError, TypeError, ValueError, KeyError) as e:
                why = ("the checkpoint has no scheduler state and its optimizer groups do not fit this "
                       f"{type(self.scheduler).__name__}: {e}" if kept else str(e))
                raise bad("scheduler", why) from None
        loader_state = state.get("train_loader")
        if not hasattr(self.train_loader, "load_state_dict"):
            loader_state = None
        if loader_state is not None and isinstance(self.train_loader, DataLoader):
            _check_loader_state(self.train_loader, loader_state, bad)
        history = _checked_history(state.get("history"), epoch, bad)

        def apply() -> int:
            if loader_state is not None:
                try:  # first: a loader of unknown type is the one thing that may still refuse its state
                    self.train_loader.load_state_dict(loader_state)
                except (TypeError, ValueError, KeyError) as e:
                    raise bad("train_loader", f"{type(e).__name__}: {e}") from e
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(opt_state)
            if self.scheduler is not None and sched_state is not None:
                self.scheduler.load_state_dict(sched_state)
            self.global_step = state["global_step"]
            self.history = History(self.best_metric, self.best_mode)
            self.history._load(history)
            self._since_best = state.get("epochs_since_best", 0)
            self.dashboard.message(f"resumed from {path} (epoch {epoch})")
            if state.get("seed", self.seed) != self.seed:  # the seed schedule is the learner's, not the file's
                self.dashboard.message(f"note: the checkpoint was trained with seed {state['seed']}, this Learner "
                                       f"uses seed {self.seed}; the resumed run will not repeat the original")
            return epoch

        return run_id, apply

    # -- logs --------------------------------------------------------------------------------------------------
    def _write_logs(self) -> None:
        if self.out_dir is None or not self.strategy.is_main:
            return
        rows = self.history.epochs
        with open(os.path.join(self.out_dir, "metrics.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        keys = self.history.keys()
        with open(os.path.join(self.out_dir, "metrics.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow(r)

    def _plot(self) -> str | None:
        """``curves.png`` of the loss (and accuracy) curves when matplotlib is installed."""
        if self.out_dir is None or not self.history.epochs or not self.strategy.is_main:
            return None
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            return None
        fig = Figure(figsize=(9, 3.5))
        FigureCanvasAgg(fig)  # Agg without switching pyplot's global backend
        epochs = self.history["epoch"]
        groups = [("loss", [k for k in self.history.keys() if k.endswith("_loss")])]
        acc = [k for k in self.history.keys() if k.endswith("_accuracy") and "top" not in k]
        if acc:
            groups.append(("accuracy", acc))
        for i, (title, keys) in enumerate(groups):
            ax = fig.add_subplot(1, len(groups), i + 1)
            for k in keys:
                ax.plot(epochs, [np.nan if v is None else v for v in self.history[k]], marker="o", label=k)
            ax.set_xlabel("epoch")
            ax.set_title(title)
            ax.legend()
        fig.tight_layout()
        path = os.path.join(self.out_dir, "curves.png")
        fig.savefig(path, dpi=100)
        return path

    # -- the training step ------------------------------------------------------------------------------------
    def _make_steps(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The step functions the loop calls: ``step(x, y)`` (forward, backward, clipping, update, zero_grad;
        returns the detached loss, output and gradient norm) and ``micro(x, y, weight)`` (forward and the weighted
        backward of one micro-batch of an accumulated step), each through :func:`ember.compile` when replay is on
        and the strategy runs in one process (a data-parallel step talks to other processes)."""
        module, loss_fn, optimizer, clip = self._train_module, self.loss_fn, self.optimizer, self.clip_grad_norm
        autocast = self._autocast

        def micro(x: Any, y: Any, weight: float) -> tuple[Tensor, Any]:
            with autocast():
                out = module(x)
                loss = loss_fn(out, y)
            # weight by the micro-batch's share so the summed gradient is the big batch's mean-loss gradient
            (loss if weight == 1.0 else loss * weight).backward()
            return loss.detach(), _detached(out)

        def step(x: Any, y: Any) -> tuple[Tensor, Any, Tensor | None]:
            loss, out = micro(x, y, 1.0)
            norm = None
            if clip is not None:
                params = [p for p in module.parameters() if p.grad is not None]
                norm = ember.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            optimizer.zero_grad()
            return loss, out, norm

        if not self.compile or self.strategy.name != "single":
            if self.compile and self.strategy.is_main:
                self.dashboard.message(f"compile: the {self.strategy.name!r} strategy's steps run eagerly (they "
                                       "communicate with other processes)")
            return step, micro
        return ember.compile(step), ember.compile(micro)

    def compile_stats(self) -> dict[str, Any] | None:
        """What whole-step replay did so far (:meth:`ember.compile.CompiledFunction.stats` of the step, and of the
        micro-batch step under gradient accumulation), or None with ``compile=False``."""
        stats = getattr(self._compiled_step, "stats", None)
        if stats is None:
            return None
        return stats() if self.grad_accum_steps == 1 else self._compiled_micro.stats()

    def _report_compile(self) -> None:
        """Say once why the steps run eagerly, if they do."""
        stats = self.compile_stats()
        if self._compile_reported or stats is None or stats["replays"] or stats["reason"] is None:
            return
        self._compile_reported = True
        if self.strategy.is_main:
            self.dashboard.message(f"compile: training steps run eagerly: {stats['reason']} (compile=False or "
                                   "EMBER_REPLAY=0 turns replay off)")

    # -- loops -------------------------------------------------------------------------------------------------
    def _scheduler_step(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()

    def _optimizer_step(self) -> float | None:
        norm = None
        if self.clip_grad_norm is not None:
            params = [p for p in self.model.parameters() if p.grad is not None]
            norm = float(ember.nn.utils.clip_grad_norm_(params, self.clip_grad_norm).item())
        self.optimizer.step()
        self.optimizer.zero_grad()
        self._after_update()
        return norm

    def _after_update(self) -> None:
        self.global_step += 1
        if self.scheduler_interval == "step":
            self._scheduler_step()

    def _train_epoch(self, epoch: int, acc: EpochMetrics, meter: Throughput) -> list[float]:
        self.model.train()
        self.optimizer.zero_grad()
        norms: list[float] = []
        group: list[tuple[Any, Any]] = []
        steps = 0
        it = iter(self.train_loader)
        done = False
        while not done:
            group = []
            while len(group) < self.grad_accum_steps:
                batch = next(it, None)
                if batch is None:
                    done = True
                    break
                group.append(self._split(batch))
            if not group:
                break
            total = sum(_batch_size(y) for _, y in group)
            if self.grad_accum_steps == 1:  # one compiled step: forward, backward, clipping, update, zero_grad
                x, y = group[0]
                loss, out, norm_t = self._compiled_step(x, y)
                n = _batch_size(y)
                acc.update(float(loss.item()), n, _host(out) if acc.needs_outputs else None,
                           _host(y) if acc.needs_outputs else None)
                meter.update(n)
                norm = None if norm_t is None else float(norm_t.item())
                self._after_update()
            else:
                for x, y in group:
                    n = _batch_size(y)
                    loss, out = self._compiled_micro(x, y, n / total)
                    acc.update(float(loss.item()), n, _host(out) if acc.needs_outputs else None,
                               _host(y) if acc.needs_outputs else None)
                    meter.update(n)
                norm = self._optimizer_step()
            self._report_compile()
            if norm is not None:
                norms.append(norm)
            steps += 1
            live = {"loss": acc.loss.value, "lr": learning_rate(self.optimizer), "samples_per_sec": meter.value}
            self.dashboard.step(epoch=epoch, step=steps, metrics=live)
            for cb in self.callbacks:
                cb.on_step_end(self, epoch, steps, live)
        return norms

    def evaluate(self, loader: Iterable[Any] | None = None) -> dict[str, float]:
        """Validation metrics (``valid_*``) of the model on ``loader`` (default: the valid loader), no gradients."""
        loader = self.valid_loader if loader is None else loader
        if loader is None:
            return {}
        acc = EpochMetrics(self.metrics)
        self.model.eval()
        with ember.no_grad():
            for batch in loader:
                x, y = self._split(batch, "valid")
                with self._autocast():
                    out = self.model(x)
                    loss = self.loss_fn(out, y)
                acc.update(float(loss.item()), _batch_size(y), _host(out) if acc.needs_outputs else None,
                           _host(y) if acc.needs_outputs else None)
        self.model.train()
        return acc.compute("valid")

    def fit(self, epochs: int, resume: str | os.PathLike[str] | None = None, *, overwrite: bool = False) -> History:
        """Train until ``epochs`` epochs are complete (counting those restored by ``resume``); returns the History.

        ``resume``: None (start fresh), ``"latest"`` (the newest checkpoint of the last run in out_dir, fresh if
        there is none) or a checkpoint path. A fresh run gets a new run id; a resumed one keeps its checkpoint's.
        A run only rotates its own checkpoints, and out_dir holding checkpoints of another run raises
        ``RunConflictError`` before anything changes, unless ``overwrite=True``, which moves that run's files
        (and its logs) into ``out_dir/replaced-<date>-<time>/``. A checkpoint that fails validation raises
        ``InvalidCheckpointError`` (or ``IncompatibleStateError`` for another model) and changes nothing.
        Ctrl-C stops cleanly: the History comes back with ``interrupted=True``.
        """
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueRangeError(f"Learner.fit: epochs must be a positive int, got {epochs!r}")
        if not isinstance(overwrite, bool):
            raise DTypeError(f"Learner.fit: overwrite must be a bool, got {type(overwrite).__name__}")
        self._check_out_dir()
        # every rank resumes from the file rank 0 chose (a newer checkpoint may appear while others look)
        path = self.strategy.broadcast_object(self._resume_path(resume) if resume is not None else None)
        run_id, apply = self._prepare_resume(path) if path is not None else (None, None)
        if self.out_dir is not None and self.strategy.is_main:  # a conflict is refused before anything changes ...
            ckpt.claim_out_dir(self.out_dir, run_id, overwrite=overwrite, dry_run=True)
        if apply is None:
            self._since_best, start = 0, 0
            self.history = History(self.best_metric, self.best_mode)
        else:
            start = apply()  # sets history and counters itself
        if self.out_dir is not None and overwrite and self.strategy.is_main:  # ... files move aside once resumed
            ckpt.claim_out_dir(self.out_dir, run_id, overwrite=True)
        self.run_id = self.strategy.broadcast_object(run_id if run_id is not None else ckpt.new_run_id())
        self._check_batch(self.train_loader, "train")
        if self.valid_loader is not None:
            self._check_batch(self.valid_loader, "valid")
        steps = len(self.train_loader) if hasattr(self.train_loader, "__len__") else None
        if steps is not None:
            steps = math.ceil(steps / self.grad_accum_steps)
        self.dashboard.start(total_epochs=epochs, start_epoch=start, steps_per_epoch=steps, device=str(self.device),
                             best_metric=self.best_metric)
        t0 = time.perf_counter() - self.history.elapsed
        try:
            for epoch in range(start, epochs):
                if self._run_epoch(epoch, t0):
                    break
        except KeyboardInterrupt:
            self.history.interrupted = True
            self.dashboard.message("interrupted (Ctrl-C): stopping; completed checkpoints are kept")
        finally:
            self.history.elapsed = time.perf_counter() - t0
            self.dashboard.close(self.history.summary())
        if not self.history.interrupted:
            self._plot()
        return self.history

    def _run_epoch(self, epoch: int, t0: float) -> bool:
        """One epoch (0-based); returns True when early stopping ends training."""
        self.device.seed(self.seed + epoch)  # the seed schedule that makes resume exact
        if hasattr(self.train_loader, "set_epoch"):
            self.train_loader.set_epoch(epoch)
        if self.valid_loader is not None and hasattr(self.valid_loader, "set_epoch"):
            self.valid_loader.set_epoch(epoch)
        acc, meter = EpochMetrics(self.metrics), Throughput()
        lr = learning_rate(self.optimizer)
        norms = self._train_epoch(epoch, acc, meter)
        train_time = meter.elapsed
        record: dict[str, Any] = {"epoch": epoch + 1, **acc.compute("train")}
        record.update(self.evaluate())
        record["lr"] = lr
        if norms:
            record["grad_norm"] = float(np.mean(norms))
        record["samples_per_sec"] = meter.samples / train_time if train_time > 0 else 0.0
        record["epoch_time"] = meter.elapsed
        record = self.strategy.reduce_metrics(record)
        if self.scheduler_interval == "epoch":
            self._scheduler_step()
        h = self.history
        value = record.get(self.best_metric)
        is_best = h.improves(value)
        if is_best:
            h.best_epoch, h.best_value = epoch + 1, float(value)
            self._since_best = 0
        else:
            self._since_best += 1
        h.epochs.append(record)
        h.elapsed = time.perf_counter() - t0
        self._save(epoch + 1, is_best)
        self._write_logs()
        self.dashboard.epoch(record=record, best=h.best_record())
        for cb in self.callbacks:
            cb.on_epoch_end(self, record)
        patience = self.early_stopping_patience
        if patience is not None and self._since_best >= patience:
            h.stopped_early = True
            self.dashboard.message(f"early stopping: no {self.best_metric} improvement for {self._since_best} "
                                   f"epochs (patience {patience})")
            return True
        return False


def _detached(out: Any) -> Any:
    """A model's output (a tensor, or a tuple/list/dict of them) without its autodiff graph."""
    if isinstance(out, Tensor):
        return out.detach()
    if isinstance(out, (tuple, list)):
        return type(out)(_detached(o) for o in out)
    if isinstance(out, dict):
        return {k: _detached(v) for k, v in out.items()}
    return out


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_loader_state(loader: DataLoader, state: Any, bad: Callable[[str, str], Exception]) -> None:
    """A DataLoader state: ints epoch, seed >= 0 and a position within the epoch."""
    if not isinstance(state, Mapping):
        raise bad("train_loader", f"is a {type(state).__name__}; expected a dict")
    for key in ("epoch", "seed", "position"):
        if not _is_count(state.get(key)):
            raise bad(f"train_loader.{key}", f"is {state.get(key)!r:.60}; expected an int >= 0")
    if not loader.iterable and state["position"] > len(loader):
        raise bad("train_loader.position", f"is {state['position']}, past the loader's {len(loader)} batches")


def _checked_history(h: Any, epoch: int, bad: Callable[[str, str], Exception]) -> dict[str, Any]:
    """The history of a checkpoint of ``epoch`` completed epochs: one record per epoch, a consistent best."""
    if not isinstance(h, Mapping) or not isinstance(h.get("epochs"), list):
        raise bad("history", "missing or not a dict with an 'epochs' list")
    records_ = h["epochs"]
    for i, r in enumerate(records_):
        if not isinstance(r, Mapping) or r.get("epoch") != i + 1 or isinstance(r.get("epoch"), bool):
            raise bad(f"history.epochs[{i}]", f"expected the record of epoch {i + 1}, got {r!r:.80}")
        for k, v in r.items():
            if not isinstance(k, str) or not (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))):
                raise bad(f"history.epochs[{i}].{k}", f"is {v!r:.60}; expected a number or None")
    if len(records_) != epoch:
        raise bad("history.epochs", f"holds {len(records_)} records for a checkpoint of epoch {epoch}")
    best_epoch, best_value = h.get("best_epoch"), h.get("best_value")
    if best_epoch is None:
        if best_value is not None:
            raise bad("history.best_value", f"is {best_value!r} without a best_epoch")
    elif not (_is_count(best_epoch) and 1 <= best_epoch <= epoch):
        raise bad("history.best_epoch", f"is {best_epoch!r:.60}; expected an epoch in 1..{epoch}")
    elif not (isinstance(best_value, (int, float)) and not isinstance(best_value, bool)
              and math.isfinite(best_value)):
        raise bad("history.best_value", f"is {best_value!r:.60}; expected a finite number")
    elapsed = h.get("elapsed", 0.0)
    if not (isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) and math.isfinite(elapsed)
            and elapsed >= 0):
        raise bad("history.elapsed", f"is {elapsed!r:.60}; expected a finite number >= 0")
    return {"epochs": records_, "best_epoch": best_epoch, "best_value": best_value, "elapsed": float(elapsed)}


def _batch_size(y: Any) -> int:
    shape = getattr(y, "shape", None)
    if shape:
        return int(shape[0])
    return len(y) if hasattr(y, "__len__") else 1


def _host(t: Any) -> np.ndarray | None:
    return t.detach().numpy() if _is_tensor(t) else None
