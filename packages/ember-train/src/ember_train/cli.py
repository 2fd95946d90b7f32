"""``ember train <example>``: the built-in training recipes behind the ``ember`` command.

Core's ``ember`` CLI finds :func:`register_train` through the ``ember.commands`` entry point; ``python -m
ember_train.cli <example>`` runs the same recipes without it. Every recipe trains on
``--device`` (default ``ember.Device.default()``) decorated with ``.autodiff()``, shows the Learner dashboard (or
a plain log when stdout is not a terminal), writes checkpoints and metric logs to ``--out`` and ends with the
final validation figures and the time taken.

Recipes beyond the built-in ones come from other packages through the entry-point group ``ember_train.recipes``
(see :data:`RECIPE_GROUP`): each entry point names a :class:`Recipe`, loaded only when ``ember train <name>`` runs
it. :data:`OPTIONAL_RECIPES` names the recipes of optional first-party packages, so ``ember train <name>`` without
the package says which extra installs it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import ember
from ember import nn

from . import checkpoint as ckpt
from .checkpoint import RunConflictError
from .metrics import evaluate_accuracy

__all__ = ["EXAMPLES", "OPTIONAL_RECIPES", "RECIPE_GROUP", "Defaults", "Recipe", "RecipeUnavailableError", "Settings",
           "build_parser", "main", "plugin_recipes", "recipe", "register_train", "run"]

# `ember train seed-cnn` promises this on the digits (issue 5); the run reports whether it was met
TARGET_ACCURACY = 0.97


@dataclass(frozen=True)
class Defaults:
    """Hyper-parameters of a recipe; ``quick_*`` replace them under ``--quick``."""

    epochs: int
    batch_size: int
    lr: float
    quick_epochs: int = 1
    quick_batch_size: int = 32
    help: str = ""


EXAMPLES: dict[str, Defaults] = {
    # measured on flex (2 cores): ~4-6 s per epoch; 8 epochs of OneCycle Adam with 2-pixel shifts reach ~99 %
    "seed-cnn": Defaults(8, 64, 2e-3, help="the seed CNN on the UCI digits (28x28) with the Learner (default)"),
    "seed-cnn-manual": Defaults(8, 64, 2e-3, help="the seed CNN on the digits with a hand-written training loop"),
    "regression-csv": Defaults(30, 64, 3e-3, quick_epochs=2, help="an MLP regressor on a CSV file it writes"),
    "text-transformer": Defaults(4, 32, 1e-3,
                                 help="the pre-norm transformer (small config) on synthetic sequences"),
}


# ----------------------------------------------------------------------------------------------------------
# recipes from other packages
# ----------------------------------------------------------------------------------------------------------
#: entry-point group through which installed packages add recipes to ``ember train``; an entry point
#: ``<name> = "<module>:<attribute>"`` names a :class:`Recipe` (``recipe.name`` must equal ``<name>``)
RECIPE_GROUP = "ember_train.recipes"

#: recipes of optional first-party packages: name -> (distribution, extra of ``ember``, one-line help). Listed so
#: ``ember train <name>`` without the package explains what to install instead of "invalid choice"
OPTIONAL_RECIPES: dict[str, tuple[str, str, str]] = {
    "lora": ("ember-lora", "lora",
             "pre-train the seed transformer on one task, fine-tune on another: full, LoRA and QLoRA side by side"),
}


class RecipeUnavailableError(ember.EmberError):
    """``ember train <name>`` names a recipe whose package is not installed, or whose entry point fails to load."""


@dataclass(frozen=True)
class Recipe:
    """A recipe another package contributes to ``ember train`` (entry-point group :data:`RECIPE_GROUP`).

    ``run(settings)`` trains with the resolved :class:`Settings` (device with autodiff, epochs, batch size, lr,
    ``out``, ``resume``, ``quick``, ``dashboard``, ``seed``) and returns ``(summary line, interrupted)``, like the
    built-in recipes. ``checkpoints=False`` tells the CLI the recipe writes no checkpoints into ``--out`` (so an
    ``--out`` holding another run is not refused). ``strategies=True`` says the recipe passes
    ``settings.strategy`` on to its Learner (``--strategy ddp``); the CLI refuses the option for other recipes
    instead of ignoring it.
    """

    name: str
    defaults: Defaults
    run: Callable[[Settings], tuple[str, bool]]
    checkpoints: bool = True
    strategies: bool = False


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=RECIPE_GROUP) if ep.name not in EXAMPLES}


def plugin_recipes() -> list[str]:
    """Names of the recipes installed packages register under :data:`RECIPE_GROUP` (nothing is imported)."""
    return sorted(_entry_points())


def recipe(name: str) -> Recipe:
    """The recipe ``ember train name`` runs: a built-in one or one an installed package registers.

    Raises :class:`RecipeUnavailableError` naming the extra to install for a known optional recipe whose package
    is absent, the entry point for one that fails to load, and the known names for anything else.
    """
    if name in RECIPES:
        learner = name != "seed-cnn-manual"  # the hand-written loop has no Learner: no checkpoints, no strategy
        return Recipe(name, EXAMPLES[name], RECIPES[name], checkpoints=learner, strategies=learner)
    ep = _entry_points().get(name)
    if ep is None:
        if name in OPTIONAL_RECIPES:
            dist, extra, _ = OPTIONAL_RECIPES[name]
            raise RecipeUnavailableError(f"the {name!r} recipe comes with {dist}, which is not installed; install it "
                                         f"with: pip install 'ember[{extra}]'")
        known = sorted([*EXAMPLES, *_entry_points()])
        raise RecipeUnavailableError(f"no recipe named {name!r} (installed recipes: {', '.join(known)})")
    try:
        found = ep.load()
    except Exception as exc:  # a broken optional package must not look like an ember-train bug
        raise RecipeUnavailableError(f"the {name!r} recipe ({ep.value}, entry-point group {RECIPE_GROUP}) failed to "
                                     f"load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(found, Recipe) or found.name != name:
        raise RecipeUnavailableError(f"the entry point {name!r} = {ep.value!r} of group {RECIPE_GROUP} must name an "
                                     f"ember_train.cli.Recipe called {name!r}, got {type(found).__name__}"
                                     f"{'' if not isinstance(found, Recipe) else f' {found.name!r}'}")
    return found


def _choices() -> list[str]:
    return [*EXAMPLES, *sorted({*_entry_points(), *OPTIONAL_RECIPES})]


# ----------------------------------------------------------------------------------------------------------
# argument handling
# ----------------------------------------------------------------------------------------------------------
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("example", nargs="?", default="seed-cnn", choices=_choices(),
                   help="which recipe to train (default: seed-cnn)")
    p.add_argument("--device", default=None,
                   help="device spec, e.g. flex (default: ember.Device.default(), honouring EMBER_DEVICE); "
                        "autodiff is added for training")
    p.add_argument("--epochs", type=int, default=None, help="number of epochs (default: the recipe's)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default: the recipe's)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe's)")
    p.add_argument("--out", default=None, help="output folder for checkpoints and logs (default: ./runs/<example>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest checkpoint (fresh if there is none)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh even if --out holds another run's checkpoints: they and their logs are "
                        "moved into --out/replaced-<date>-<time>/ (nothing is deleted)")
    p.add_argument("--quick", action="store_true", help="a tiny run (a few batches) for smoke tests and CI")
    p.add_argument("--dashboard", default="auto", choices=["auto", "rich", "plain", "none"],
                   help="live terminal dashboard (auto: rich on a terminal, plain lines otherwise)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model initialisation and the data order")
    p.add_argument("--strategy", default=None,
                   help="how the Learner spreads training over processes, e.g. ddp (with ember[distributed], under "
                        "mpiexec -n N or ember launch -n N); default: one process")


def _examples_help() -> str:
    lines = [f"  {name:<17} {d.help}" for name, d in EXAMPLES.items()]
    installed = _entry_points()
    for name in sorted({*installed, *OPTIONAL_RECIPES}):
        if name in OPTIONAL_RECIPES:
            dist, extra, text = OPTIONAL_RECIPES[name]
            text += "" if name in installed else f" (needs {dist}: pip install 'ember[{extra}]')"
        else:  # described without importing the package: `ember --help` stays fast and immune to broken plugins
            text = f"from {installed[name].value.split(':')[0]}"
        lines.append(f"  {name:<17} {text}")
    return "examples:\n" + "\n".join(lines)


def register_train(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to core's ``ember`` subcommands (the ``ember.commands`` entry point)."""
    p = subparsers.add_parser(
        "train", help="train a built-in example (seed-cnn, seed-cnn-manual, regression-csv, text-transformer, ...)",
        description="Train one of the built-in examples on a device, with a live dashboard, checkpoints and logs.",
        epilog=_examples_help(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser (``python -m ember_train.cli``) with the same options as ``ember train``."""
    p = argparse.ArgumentParser(prog="ember train", description="Train a built-in ember example.",
                                epilog=_examples_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m ember_train.cli``."""
    return run(build_parser().parse_args(argv))


def _device(spec: str | None) -> ember.Device:
    base = ember.Device.default() if spec is None else ember.Device.parse(spec)
    # training needs gradients; a spec that already names autodiff is kept as it is
    return base if "autodiff" in str(base) else base.autodiff()


@dataclass
class Settings:
    """Resolved options of one run."""

    example: str
    device: ember.Device
    epochs: int
    batch_size: int
    lr: float
    out: str
    resume: bool
    quick: bool
    dashboard: str
    seed: int
    overwrite: bool = False
    strategy: str | None = None


def _settings(args: argparse.Namespace) -> Settings:
    d = recipe(args.example).defaults
    epochs = args.epochs if args.epochs is not None else (d.quick_epochs if args.quick else d.epochs)
    batch = args.batch_size if args.batch_size is not None else (d.quick_batch_size if args.quick else d.batch_size)
    for name, value in (("--epochs", epochs), ("--batch-size", batch)):
        if value < 1:
            raise SystemExit(f"ember train: {name} must be at least 1, got {value}")
    lr = args.lr if args.lr is not None else d.lr
    if not (lr > 0 and math.isfinite(lr)):
        raise SystemExit(f"ember train: --lr must be a positive number, got {lr}")
    out = args.out or os.path.join("runs", args.example)
    return Settings(args.example, _device(args.device), epochs, batch, lr, out, bool(args.resume), bool(args.quick),
                    getattr(args, "dashboard", "auto"), getattr(args, "seed", 0),
                    bool(getattr(args, "overwrite", False)), getattr(args, "strategy", None))


def run(args: argparse.Namespace) -> int:
    """Run the recipe ``args.example``; returns the process exit status."""
    # user errors are one or two lines; the traceback only with --debug (core's `ember`) or EMBER_DEBUG=1
    debug = bool(getattr(args, "debug", False)) or os.environ.get("EMBER_DEBUG", "") not in ("", "0", "false", "no")
    try:
        chosen = recipe(args.example)
    except RecipeUnavailableError as exc:
        if debug:
            raise
        print(f"ember train {args.example}: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "strategy", None) and not chosen.strategies:
        print(f"ember train {args.example}: --strategy needs a recipe that trains with the Learner; this one does "
              "not take it", file=sys.stderr)
        return 2
    try:
        s = _settings(args)
    except ember.EmberError as exc:  # a bad --device: a missing plugin, an absent device, a malformed string
        if debug:
            raise
        print(f"ember train: {type(exc).__name__}: {exc}\n  choose another --device (`ember info` lists the "
              "installed backends and decorators)", file=sys.stderr)
        return 2
    print(f"ember train {s.example}: device {s.device}, epochs {s.epochs}, batch {s.batch_size}, lr {s.lr:g}, "
          f"out {s.out}{', resuming' if s.resume else ''}{', quick' if s.quick else ''}", flush=True)
    start = time.perf_counter()
    try:
        if chosen.checkpoints:
            _check_out(s)
        summary, interrupted = chosen.run(s)
    except KeyboardInterrupt:
        print(f"ember train {s.example}: interrupted after {time.perf_counter() - start:.1f} s; "
              f"resume with --resume --out {s.out}", file=sys.stderr)
        return 130
    except RunConflictError as exc:
        print(_conflict_message(s, exc), file=sys.stderr)
        return 1
    except ember.EmberError as exc:
        if debug:
            raise
        # a typed ember error already names what is wrong: say it plainly instead of a traceback
        print(f"ember train {s.example}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    print(f"{summary} | time taken {elapsed:.1f} s on {s.device}", flush=True)
    if interrupted:  # the Learner stopped cleanly on Ctrl-C and kept its completed checkpoints
        print(f"ember train {s.example}: interrupted; resume with --resume --out {s.out}", file=sys.stderr)
        return 130
    return 0


def _check_out(s: Settings) -> None:
    """Refuse, before a recipe writes anything, an --out holding another run's checkpoints (the Learner would too,
    but only after the recipe has written its data files there)."""
    if s.overwrite:
        return
    latest = ckpt.latest_checkpoint(s.out) if s.resume else None
    ckpt.claim_out_dir(s.out, None if latest is None else (ckpt.checkpoint_run_id(latest) or ""), op="ember train")


def _conflict_message(s: Settings, exc: RunConflictError) -> str:
    names = ", ".join(os.path.basename(p) for p in exc.paths[:4]) + (", ..." if len(exc.paths) > 4 else "")
    aside = f"moved into {os.path.join(s.out, 'replaced-<date>-<time>')}"
    if exc.resuming:
        return (f"ember train {s.example}: {s.out} also holds checkpoints of another run ({names})\n"
                f"  add --overwrite to have them {aside}, or resume into another --out")
    return (f"ember train {s.example}: {s.out} already holds checkpoints of another run ({names})\n"
            f"  continue that run with --resume, start afresh with --overwrite (its files are {aside}), "
            "or choose another --out")


# ----------------------------------------------------------------------------------------------------------
# helpers shared by the recipes
# ----------------------------------------------------------------------------------------------------------
def _last(history: Any, key: str) -> float | None:
    """The last epoch's ``key`` from a Learner History (a mapping of per-epoch lists, or of epoch records)."""
    try:
        values = history[key]
    except (KeyError, TypeError, IndexError):
        return None
    if isinstance(values, (list, tuple)):
        values = [v for v in values if v is not None]
        return float(values[-1]) if values else None
    return None if values is None else float(values)


def _best(history: Any, key: str) -> float | None:
    best = getattr(history, "best", None)
    if best is None and hasattr(history, "get"):
        best = history.get("best")
    if isinstance(best, dict):
        value = best.get(key, best.get("value"))
        return None if value is None else float(value)
    return None


def _subset(dataset: Any, n: int) -> Any:
    from .data import Subset

    return Subset(dataset, list(range(min(n, len(dataset)))))


def _learner(s: Settings, model: nn.Module, train: Any, valid: Any, loss_fn: Any, optimizer: Any, scheduler: Any,
             metrics: Sequence[str], best_metric: str, best_mode: str) -> Any:
    from .learner import Learner

    return Learner(model, train, valid, loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler,
                   scheduler_interval="step", metrics=tuple(metrics), device=s.device, out_dir=s.out,
                   best_metric=best_metric, best_mode=best_mode, dashboard=s.dashboard, seed=s.seed,
                   strategy=s.strategy)


def _digits_loaders(s: Settings) -> tuple[Any, Any]:
    from .data import DataLoader, TransformDataset
    from .datasets import digits
    from .transforms import RandomCrop

    train, valid = digits("train", seed=s.seed), digits("valid", seed=s.seed)
    # random shifts of up to 2 pixels: 1437 training images overfit quickly without augmentation
    train = TransformDataset(train, RandomCrop(28, padding=2), seed=s.seed)
    if s.quick:
        train, valid = _subset(train, 192), _subset(valid, 96)
    return (DataLoader(train, batch_size=s.batch_size, shuffle=True, seed=s.seed, device=s.device),
            DataLoader(valid, batch_size=256, device=s.device))


def _onecycle(optimizer: Any, lr: float, total_steps: int) -> Any:
    """A short warm-up then cosine decay (converges in few epochs); a constant rate for runs of a few steps."""
    if total_steps < 10:  # OneCycle's phases need a few steps each (PyTorch divides by their length)
        return None
    return ember.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total_steps, pct_start=0.25)


# ----------------------------------------------------------------------------------------------------------
# recipes
# ----------------------------------------------------------------------------------------------------------
def train_seed_cnn(s: Settings) -> tuple[str, bool]:
    """The seed CNN (docs/models.md) on the 28x28 digits with the Learner, Adam and a OneCycle schedule."""
    from .models import SeedCNN

    train, valid = _digits_loaders(s)
    ember.manual_seed(s.seed, s.device)
    model = SeedCNN().to(s.device)
    optimizer = ember.optim.Adam(model.parameters(), lr=s.lr)
    scheduler = _onecycle(optimizer, s.lr, s.epochs * len(train))
    learner = _learner(s, model, train, valid, nn.CrossEntropyLoss(), optimizer, scheduler,
                       ("loss", "accuracy"), "valid_accuracy", "max")
    history = learner.fit(s.epochs, resume="latest" if s.resume else None, overwrite=s.overwrite)
    acc, best = _last(history, "valid_accuracy"), _best(history, "valid_accuracy")
    met = "" if s.quick or acc is None else (" (target 97 % met)" if acc >= TARGET_ACCURACY else
                                             " (below the 97 % target)")
    best_text = "" if best is None else f", best {best:.2%}"
    acc_text = "n/a" if acc is None else f"{acc:.2%}"
    return f"final validation accuracy {acc_text}{best_text}{met}", history.interrupted


def train_seed_cnn_manual(s: Settings) -> tuple[str, bool]:
    """The seed CNN on the digits with a hand-written loop (PyTorch's, step for step) instead of the Learner."""
    from .models import SeedCNN

    train, valid = _digits_loaders(s)
    ember.manual_seed(s.seed, s.device)
    model = SeedCNN().to(s.device)
    optimizer = ember.optim.Adam(model.parameters(), lr=s.lr)
    scheduler = _onecycle(optimizer, s.lr, s.epochs * len(train))
    loss_fn = nn.CrossEntropyLoss()
    acc = 0.0
    for epoch in range(1, s.epochs + 1):
        model.train()
        train.set_epoch(epoch - 1)
        total, seen = 0.0, 0
        for x, y in train:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            total += loss.item() * y.shape[0]
            seen += y.shape[0]
        acc = evaluate_accuracy(model, valid)
        print(f"epoch {epoch}/{s.epochs}  train_loss {total / seen:.4f}  valid_accuracy {acc:.2%}", flush=True)
    os.makedirs(s.out, exist_ok=True)
    path = os.path.join(s.out, "model.safetensors")
    ember.records.save(model, path)
    return f"final validation accuracy {acc:.2%} (weights saved to {path})", False


def regression_mlp(features: int, hidden: int = 64) -> nn.Module:
    """A two-hidden-layer ReLU MLP with one output."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


class SqueezedMSE(nn.Module):
    """MSE between ``(N, 1)`` predictions and ``(N,)`` targets (no accidental ``(N, N)`` broadcasting)."""

    def forward(self, prediction: Any, target: Any) -> Any:
        return nn.functional.mse_loss(prediction.reshape(-1), target.reshape(-1).to(prediction.dtype))


def write_regression_csv(path: str, n: int, features: int, seed: int = 0) -> None:
    """A CSV of ``synthetic_regression`` data: columns ``x0..x{features-1}`` and ``target``."""
    from .datasets import synthetic_regression

    ds = synthetic_regression(n, features, 0.1, seed)
    rows = [ds[i] for i in range(len(ds))]
    x = np.stack([np.asarray(r[0], np.float64).reshape(-1) for r in rows])
    y = np.asarray([float(np.asarray(r[1]).reshape(-1)[0]) for r in rows])
    header = ",".join([f"x{i}" for i in range(features)] + ["target"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="", fmt="%.6g")


def train_regression_csv(s: Settings) -> tuple[str, bool]:
    """An MLP regressor on a CSV file (written from synthetic data into --out), with R^2 on the validation split."""
    from .data import DataLoader, random_split
    from .datasets import csv_dataset

    os.makedirs(s.out, exist_ok=True)
    n, features = (256, 4) if s.quick else (4000, 8)
    path = os.path.join(s.out, "regression.csv")
    write_regression_csv(path, n, features, s.seed)
    data = csv_dataset(path, "target", task="regression")
    train_ds, valid_ds = random_split(data, [0.8, 0.2], seed=s.seed)
    train = DataLoader(train_ds, batch_size=s.batch_size, shuffle=True, seed=s.seed, device=s.device)
    valid = DataLoader(valid_ds, batch_size=512, device=s.device)
    ember.manual_seed(s.seed, s.device)
    model = regression_mlp(features).to(s.device)
    optimizer = ember.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=1e-4)
    scheduler = _onecycle(optimizer, s.lr, s.epochs * len(train))
    learner = _learner(s, model, train, valid, SqueezedMSE(), optimizer, scheduler, ("loss",), "valid_loss", "min")
    history = learner.fit(s.epochs, resume="latest" if s.resume else None, overwrite=s.overwrite)
    r2 = r2_score(model, valid)
    loss = _last(history, "valid_loss")
    mse = float("nan") if loss is None else loss
    return f"final validation MSE {mse:.4f}, R^2 {r2:.4f} (data: {path})", history.interrupted


def r2_score(model: nn.Module, loader: Any) -> float:
    """Coefficient of determination of ``model`` over ``loader``."""
    model.eval()
    preds, targets = [], []
    with ember.no_grad():
        for x, y in loader:
            preds.append(model(x).reshape(-1).numpy())
            targets.append(y.reshape(-1).numpy())
    p, t = np.concatenate(preds).astype(np.float64), np.concatenate(targets).astype(np.float64)
    return float(1.0 - ((p - t) ** 2).sum() / max(((t - t.mean()) ** 2).sum(), 1e-12))


def train_text_transformer(s: Settings) -> tuple[str, bool]:
    """The seed pre-norm transformer (docs/models.md, small configuration) on synthetic sequence classification."""
    from .data import DataLoader, random_split
    from .datasets import synthetic_sequences
    from .models import text_transformer

    # the synthetic task uses a small vocabulary; the embedding table is sized to it rather than BERT's 28,996
    n, seq_len, vocab, classes = (128, 16, 64, 4) if s.quick else (2000, 64, 256, 4)
    data = synthetic_sequences(n, seq_len, vocab, classes, s.seed)
    train_ds, valid_ds = random_split(data, [0.8, 0.2], seed=s.seed)
    train = DataLoader(train_ds, batch_size=s.batch_size, shuffle=True, seed=s.seed, device=s.device)
    valid = DataLoader(valid_ds, batch_size=128, device=s.device)
    ember.manual_seed(s.seed, s.device)
    overrides: dict[str, Any] = {"vocab_size": vocab, "max_len": seq_len}
    if s.quick:
        overrides.update(d_model=32, nhead=4, dim_feedforward=64, num_layers=1)
    model = text_transformer("small", num_classes=classes, **overrides).to(s.device)
    optimizer = ember.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.01)
    scheduler = _onecycle(optimizer, s.lr, s.epochs * len(train))
    learner = _learner(s, model, train, valid, nn.CrossEntropyLoss(), optimizer, scheduler, ("loss", "accuracy"),
                       "valid_accuracy", "max")
    history = learner.fit(s.epochs, resume="latest" if s.resume else None, overwrite=s.overwrite)
    acc = _last(history, "valid_accuracy")
    acc_text = "n/a" if acc is None else f"{acc:.2%}"
    return f"final validation accuracy {acc_text} ({classes} classes)", history.interrupted


RECIPES: dict[str, Callable[[Settings], tuple[str, bool]]] = {
    "seed-cnn": train_seed_cnn,
    "seed-cnn-manual": train_seed_cnn_manual,
    "regression-csv": train_regression_csv,
    "text-transformer": train_text_transformer,
}

if __name__ == "__main__":
    sys.exit(main())
