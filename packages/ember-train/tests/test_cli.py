"""``ember train``: argument handling, the subcommand's registration in core's CLI, and quick end-to-end runs."""

from __future__ import annotations

import argparse
import os

import pytest

import ember
from ember import cli as core_cli
from ember_train import cli


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def test_defaults_and_overrides():
    s = cli._settings(parse())
    assert s.example == "seed-cnn"
    assert (s.epochs, s.batch_size, s.lr) == (8, 64, 2e-3)
    assert s.out == os.path.join("runs", "seed-cnn")
    assert "autodiff" in str(s.device) and not s.resume and not s.quick
    s = cli._settings(parse("regression-csv", "--epochs", "3", "--batch-size", "16", "--lr", "0.01", "--out", "o",
                            "--resume"))
    assert (s.example, s.epochs, s.batch_size, s.lr, s.out, s.resume) == ("regression-csv", 3, 16, 0.01, "o", True)
    q = cli._settings(parse("--quick"))
    assert (q.epochs, q.batch_size) == (1, 32)


def test_device_is_decorated_with_autodiff():
    assert str(cli._device("flex")) == "flex+autodiff"
    assert str(cli._device("flex+autodiff")) == "flex+autodiff"  # not decorated twice
    assert cli._device(None) == ember.Device.default().autodiff()


@pytest.mark.parametrize("argv, message", [
    (("--epochs", "0"), "--epochs must be at least 1, got 0"),
    (("--batch-size", "-2"), "--batch-size must be at least 1, got -2"),
    (("--lr", "0"), "--lr must be a positive number, got 0"),
    (("--lr", "nan"), "--lr must be a positive number, got nan"),
])
def test_bad_numbers_exit_with_message(argv, message):
    with pytest.raises(SystemExit, match=message):
        cli._settings(parse(*argv))


def test_unknown_example_is_rejected(capsys):
    with pytest.raises(SystemExit):
        parse("resnet")
    assert "invalid choice: 'resnet'" in capsys.readouterr().err


def test_registered_in_core_cli(capsys):
    parser = core_cli.build_parser()
    args = parser.parse_args(["train", "text-transformer", "--quick", "--epochs", "2"])
    assert args.func is cli.run and args.example == "text-transformer" and args.epochs == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--help"])
    out = capsys.readouterr().out
    for name in cli.EXAMPLES:
        assert name in out
    for option in ("--device", "--epochs", "--batch-size", "--lr", "--out", "--resume", "--quick"):
        assert option in out


def test_register_train_on_a_fresh_parser():
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers(dest="command")
    p = cli.register_train(sub)
    assert p.prog.endswith("train")
    assert parser.parse_args(["train"]).example == "seed-cnn"


def test_quick_seed_cnn_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["seed-cnn", "--quick", "--epochs", "2", "--out", str(out), "--dashboard", "plain"]
    rc = core_cli.main(["train", *argv, "--device", "flex"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "ember train seed-cnn: device flex+autodiff, epochs 2, batch 32" in text
    assert "final validation accuracy" in text and "time taken" in text
    files = set(os.listdir(out))
    assert {"checkpoint-epoch1.safetensors", "checkpoint-epoch2.safetensors", "best.safetensors", "metrics.jsonl",
            "metrics.csv"} <= files
    # as if the run had stopped after epoch 1: --resume continues from the latest checkpoint, only epoch 2 runs
    (out / "checkpoint-epoch2.safetensors").unlink()
    rc = cli.main([*argv, "--resume"])
    text = capsys.readouterr().out
    assert rc == 0 and "resuming" in text
    assert "epoch 2/2" in text and "epoch 1/2" not in text
    assert "checkpoint-epoch2.safetensors" in os.listdir(out)


@pytest.mark.parametrize("example, key", [
    ("seed-cnn-manual", "final validation accuracy"),
    ("regression-csv", "R^2"),
    ("text-transformer", "final validation accuracy"),
])
def test_quick_examples(tmp_path, capsys, example, key):
    rc = cli.main([example, "--quick", "--out", str(tmp_path), "--dashboard", "none"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert key in text and "time taken" in text


def test_unwritable_output_dir_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc = cli.main(["seed-cnn", "--quick", "--out", str(blocker / "run"), "--dashboard", "none"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "ember train seed-cnn:" in err and str(blocker) in err


def test_bad_device_is_a_clear_error():
    with pytest.raises(ember.EmberError):
        cli._device("no-such-device")


def test_strategy_reaches_the_settings_and_is_refused_where_no_learner_runs(tmp_path, capsys):
    assert cli._settings(parse("--strategy", "ddp")).strategy == "ddp"
    assert cli._settings(parse()).strategy is None
    rc = cli.main(["seed-cnn-manual", "--quick", "--strategy", "ddp", "--out", str(tmp_path), "--dashboard", "none"])
    assert rc == 2
    assert "--strategy needs a recipe that trains with the Learner" in capsys.readouterr().err


def test_an_unknown_strategy_is_a_clear_error_naming_the_installed_ones(tmp_path, capsys):
    rc = cli.main(["regression-csv", "--quick", "--strategy", "nosuch", "--out", str(tmp_path), "--dashboard",
                   "none", "--device", "flex"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "unknown strategy 'nosuch'; installed strategies:" in err and "single" in err
