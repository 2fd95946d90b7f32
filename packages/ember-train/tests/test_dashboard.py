"""Dashboards: sparklines, plain one-line logs, and the rich Live view rendered into a string console."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ember.errors import ValueRangeError
from ember_train.dashboard import Dashboard, PlainDashboard, RichDashboard, make_dashboard, sparkline

RECORD = {"epoch": 1, "train_loss": 0.5, "train_accuracy": 0.8, "valid_loss": 0.6, "valid_accuracy": 0.75,
          "lr": 0.01, "samples_per_sec": 1234.5}


def test_sparkline():
    assert sparkline([]) == ""
    line = sparkline([3.0, 2.0, 1.0, 0.0])
    assert line == "█▆▃▁"
    assert sparkline([1.0, 1.0]) == "▅▅"
    assert len(sparkline(list(range(100)), width=10)) == 10
    assert sparkline([float("nan"), 1.0, 2.0]) == "▁█"


def test_plain_dashboard_lines(capsys):
    d = PlainDashboard(log_every=2)
    d.start(total_epochs=3, start_epoch=0, steps_per_epoch=4, device="flex", best_metric="valid_accuracy")
    for s in range(1, 5):
        d.step(epoch=0, step=s, metrics={"loss": 1.0 / s})
    d.epoch(record=RECORD, best=RECORD)
    d.close("done")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "training on flex: epochs 1..3, 4 steps/epoch"
    assert lines[1] == "epoch 1/3 step 2/4  loss 0.5000"
    assert lines[2] == "epoch 1/3 step 4/4  loss 0.2500"
    assert lines[3].startswith("epoch 1/3  train_loss 0.5000  train_accuracy 0.8000")
    assert lines[3].endswith("*best*") and "samples_per_sec 1234.5000" in lines[3]
    assert lines[4] == "done"


def test_plain_dashboard_resume_note(capsys):
    d = PlainDashboard()
    d.start(total_epochs=5, start_epoch=2, steps_per_epoch=None, device="flex", best_metric="valid_loss")
    assert "epochs 3..5, ? steps/epoch (resuming after epoch 2)" in capsys.readouterr().out


def test_rich_dashboard_renders_to_string_console():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system=None)
    d = RichDashboard(console=console)
    d.start(total_epochs=2, start_epoch=0, steps_per_epoch=3, device="flex+autodiff", best_metric="valid_accuracy")
    for s in range(1, 4):
        d.step(epoch=0, step=s, metrics={"loss": 1.0 / s, "samples_per_sec": 500.0})
    d.epoch(record=RECORD, best=RECORD)
    d.message("a note")
    d.close("training finished")
    out = buf.getvalue()
    assert "flex+autodiff" in out and "valid_accuracy" in out
    assert "accuracy" in out and "0.7500" in out and "training finished" in out
    assert "epochs" in out and "ETA" in out
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█")  # the loss sparkline
    assert "a note" in out


def test_make_dashboard():
    assert type(make_dashboard("none")) is Dashboard
    assert isinstance(make_dashboard("plain"), PlainDashboard)
    assert isinstance(make_dashboard("auto"), PlainDashboard)  # pytest's stdout is not a TTY
    assert isinstance(make_dashboard("rich", console=Console(file=io.StringIO())), RichDashboard)
    custom = PlainDashboard()
    assert make_dashboard(custom) is custom
    with pytest.raises(ValueRangeError, match="dashboard must be"):
        make_dashboard("fancy")

