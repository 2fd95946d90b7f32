"""Training dashboards: a rich ``Live`` view on terminals, plain one-line logs elsewhere (CI, files, tests).

Every dashboard has the same hooks, called by the Learner: ``start(...)``, ``step(...)``, ``epoch(...)``,
``message(text)`` and ``close(summary)``. :func:`make_dashboard` picks one: ``"auto"`` is rich when
``sys.stdout.isatty()`` and plain otherwise; ``"rich"``, ``"plain"`` and ``"none"`` force one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ember.errors import ValueRangeError

__all__ = ["Dashboard", "PlainDashboard", "RichDashboard", "make_dashboard", "sparkline", "format_metrics"]

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """A one-line text chart of the last ``width`` finite values (block characters, min to max)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo
    if span <= 0:
        return _BLOCKS[len(_BLOCKS) // 2] * len(vals)
    return "".join(_BLOCKS[min(int((v - lo) / span * (len(_BLOCKS) - 1) + 0.5), len(_BLOCKS) - 1)] for v in vals)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


_SKIP = ("epoch", "step")


def format_metrics(record: Mapping[str, Any]) -> str:
    """``"train_loss 0.1234  valid_accuracy 0.9800 ..."`` (the epoch number is printed separately)."""
    return "  ".join(f"{k} {_fmt(v)}" for k, v in record.items() if k not in _SKIP)


class Dashboard:
    """The no-op dashboard (``dashboard="none"``) and the base of the others."""

    def start(self, *, total_epochs: int, start_epoch: int, steps_per_epoch: int | None, device: str,
              best_metric: str) -> None:
        """Training begins at ``start_epoch`` (0-based, > 0 when resuming)."""

    def step(self, *, epoch: int, step: int, metrics: Mapping[str, float]) -> None:
        """An optimizer step finished (``step`` is 1-based within the epoch)."""

    def epoch(self, *, record: Mapping[str, Any], best: Mapping[str, Any] | None) -> None:
        """An epoch finished; ``record`` is its metrics, ``best`` the best epoch so far."""

    def message(self, text: str) -> None:
        """A one-off note (resume, early stop, interruption)."""

    def close(self, summary: str) -> None:
        """Training ended; print the summary."""


class PlainDashboard(Dashboard):
    """One line per epoch (and every ``log_every`` steps), printed to ``file`` (stdout when None)."""

    def __init__(self, log_every: int | None = None, file: Any = None) -> None:
        self.log_every = log_every
        self.file = file
        self.total_epochs = 0
        self.steps: int | None = None

    def _print(self, text: str) -> None:
        print(text, file=self.file if self.file is not None else sys.stdout, flush=True)

    def start(self, *, total_epochs: int, start_epoch: int, steps_per_epoch: int | None, device: str,
              best_metric: str) -> None:
        self.total_epochs, self.steps = total_epochs, steps_per_epoch
        where = f" (resuming after epoch {start_epoch})" if start_epoch else ""
        self._print(f"training on {device}: epochs {start_epoch + 1}..{total_epochs}, "
                    f"{steps_per_epoch if steps_per_epoch is not None else '?'} steps/epoch{where}")

    def step(self, *, epoch: int, step: int, metrics: Mapping[str, float]) -> None:
        if self.log_every and step % self.log_every == 0:
            of = f"/{self.steps}" if self.steps else ""
            self._print(f"epoch {epoch + 1}/{self.total_epochs} step {step}{of}  {format_metrics(metrics)}")

    def epoch(self, *, record: Mapping[str, Any], best: Mapping[str, Any] | None) -> None:
        mark = "  *best*" if best is not None and best.get("epoch") == record.get("epoch") else ""
        self._print(f"epoch {record['epoch']}/{self.total_epochs}  {format_metrics(record)}{mark}")

    def message(self, text: str) -> None:
        self._print(text)

    def close(self, summary: str) -> None:
        self._print(summary)


class RichDashboard(Dashboard):
    """A rich ``Live`` view: epoch and step progress bars with ETA, a metrics table, loss sparklines, throughput."""

    def __init__(self, console: Any = None, refresh_per_second: float = 4.0, chart_width: int = 48) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console if console is not None else Console()
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=self.console)
        self.refresh_per_second = refresh_per_second
        self.chart_width = chart_width
        self.live: Any = None
        self.device = ""
        self.best_metric = ""
        self.step_losses: list[float] = []
        self.train_curve: list[float] = []
        self.valid_curve: list[float] = []
        self.current: dict[str, Any] = {}
        self.best: Mapping[str, Any] | None = None
        self.throughput = 0.0
        self.notes: list[str] = []
        self.t_step = time.perf_counter()

    def _render(self) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        head = Text(f"device {self.device}   {self.throughput:,.0f} samples/s   best by {self.best_metric}",
                    style="cyan")
        table = Table(show_header=True, header_style="bold", expand=False)
        table.add_column("metric")
        table.add_column("train", justify="right")
        table.add_column("valid", justify="right")
        table.add_column("best", justify="right")
        names = []
        for key in list(self.current) + list(self.best or {}):
            for prefix in ("train_", "valid_"):
                if key.startswith(prefix) and key[len(prefix):] not in names:
                    names.append(key[len(prefix):])
        best = self.best or {}
        for n in names:
            bv = [best.get(f"{p}_{n}") for p in ("train", "valid")]
            table.add_row(n, _fmt(self.current.get(f"train_{n}", "")), _fmt(self.current.get(f"valid_{n}", "")),
                          " / ".join(_fmt(v) for v in bv if v is not None))
        for extra in ("lr", "grad_norm"):
            if extra in self.current:
                table.add_row(extra, _fmt(self.current[extra]), "", "")
        chart = Text()
        chart.append("loss (steps) ", style="bold")
        chart.append(sparkline(self.step_losses, self.chart_width) + "\n", style="green")
        chart.append("train/epoch  ", style="bold")
        chart.append(sparkline(self.train_curve, self.chart_width) + "\n", style="green")
        chart.append("valid/epoch  ", style="bold")
        chart.append(sparkline(self.valid_curve, self.chart_width), style="magenta")
        parts: list[Any] = [head, self.progress, table, Panel(chart, title="loss", expand=False)]
        parts += [Text(n, style="yellow") for n in self.notes[-3:]]
        return Group(*parts)

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def start(self, *, total_epochs: int, start_epoch: int, steps_per_epoch: int | None, device: str,
              best_metric: str) -> None:
        from rich.live import Live

        self.device, self.best_metric = device, best_metric
        self.epoch_task = self.progress.add_task("epochs", total=total_epochs, completed=start_epoch)
        self.step_task = self.progress.add_task("steps", total=steps_per_epoch)
        self.live = Live(self._render(), console=self.console, refresh_per_second=self.refresh_per_second,
                         transient=False)
        self.live.start()

    def step(self, *, epoch: int, step: int, metrics: Mapping[str, float]) -> None:
        self.progress.update(self.step_task, completed=step, description=f"epoch {epoch + 1} steps")
        loss = metrics.get("loss")
        if loss is not None:
            self.step_losses.append(float(loss))
            self.step_losses = self.step_losses[-4 * self.chart_width:]
        if "samples_per_sec" in metrics:
            self.throughput = float(metrics["samples_per_sec"])
        now = time.perf_counter()
        if now - self.t_step > 1.0 / self.refresh_per_second:  # rebuilding the view every step would cost time
            self.t_step = now
            self._refresh()

    def epoch(self, *, record: Mapping[str, Any], best: Mapping[str, Any] | None) -> None:
        self.current, self.best = dict(record), best
        self.throughput = float(record.get("samples_per_sec", self.throughput))
        if "train_loss" in record:
            self.train_curve.append(float(record["train_loss"]))
        if "valid_loss" in record:
            self.valid_curve.append(float(record["valid_loss"]))
        self.progress.update(self.epoch_task, completed=int(record["epoch"]))
        self.progress.reset(self.step_task)
        self._refresh()

    def message(self, text: str) -> None:
        self.notes.append(text)
        self._refresh()

    def close(self, summary: str) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.stop()
            self.live = None
        self.console.print(summary)


def make_dashboard(kind: str | Dashboard = "auto", *, log_every: int | None = None, console: Any = None
                   ) -> Dashboard:
    """A dashboard by name: ``"auto"`` (rich on a TTY, else plain), ``"rich"``, ``"plain"``, ``"none"``."""
    if isinstance(kind, Dashboard):
        return kind
    if kind == "auto":
        kind = "rich" if (console is not None or sys.stdout.isatty()) else "plain"
    if kind == "rich":
        return RichDashboard(console=console)
    if kind == "plain":
        return PlainDashboard(log_every=log_every)
    if kind in ("none", None):
        return Dashboard()
    raise ValueRangeError(f"dashboard must be 'auto', 'rich', 'plain', 'none' or a Dashboard, got {kind!r}")
