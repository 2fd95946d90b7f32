"""``ember train`` recipes from other packages: the ``ember_train.recipes`` entry-point group, the install hint for
an optional recipe whose package is missing, and broken entry points. Fakes stand in for the packages."""

from __future__ import annotations

from typing import Any

import pytest

from ember_train import cli


class FakeEntryPoint:
    """Duck-types ``importlib.metadata.EntryPoint`` (name, value, load)."""

    def __init__(self, name: str, value: str, load: Any) -> None:
        self.name, self.value, self._load = name, value, load

    def load(self) -> Any:
        return self._load()


def _install(monkeypatch: pytest.MonkeyPatch, *eps: FakeEntryPoint) -> None:
    monkeypatch.setattr(cli, "_entry_points", lambda: {ep.name: ep for ep in eps})


def _recorded_recipe(name: str, calls: list[Any], checkpoints: bool = True) -> cli.Recipe:
    def run(s: cli.Settings) -> tuple[str, bool]:
        calls.append(s)
        return f"{name} done", False

    return cli.Recipe(name, cli.Defaults(5, 16, 0.1, quick_epochs=2, quick_batch_size=4, help="a test recipe"), run,
                      checkpoints=checkpoints)


def test_missing_optional_recipe_names_the_extra(monkeypatch, capsys):
    _install(monkeypatch)  # as if ember-lora were not installed
    args = cli.build_parser().parse_args(["lora", "--quick"])  # still a valid choice: the hint beats "invalid choice"
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert "ember train lora: the 'lora' recipe comes with ember-lora, which is not installed" in err
    assert "pip install 'ember[lora]'" in err
    with pytest.raises(cli.RecipeUnavailableError, match=r"ember\[lora\]"):
        cli.recipe("lora")
    assert "needs ember-lora: pip install 'ember[lora]'" in cli._examples_help()


def test_plugin_recipe_runs_with_its_defaults(monkeypatch, tmp_path, capsys):
    calls: list[Any] = []
    _install(monkeypatch, FakeEntryPoint("demo", "demo_pkg.recipes:RECIPE", lambda: _recorded_recipe("demo", calls)))
    assert cli.plugin_recipes() == ["demo"]
    assert "demo" in cli._choices() and "from demo_pkg.recipes" in cli._examples_help()
    rc = cli.main(["demo", "--quick", "--out", str(tmp_path), "--device", "flex"])
    assert rc == 0
    (s,) = calls
    assert (s.example, s.epochs, s.batch_size, s.lr, s.quick) == ("demo", 2, 4, 0.1, True)
    assert "autodiff" in str(s.device)
    assert "demo done | time taken" in capsys.readouterr().out
    assert cli._settings(cli.build_parser().parse_args(["demo"])).epochs == 5


def test_plugin_recipe_in_core_cli(monkeypatch):
    from ember import cli as core_cli

    _install(monkeypatch, FakeEntryPoint("demo", "demo_pkg:R", lambda: _recorded_recipe("demo", [])))
    args = core_cli.build_parser().parse_args(["train", "demo", "--epochs", "3"])
    assert args.func is cli.run and args.example == "demo" and args.epochs == 3


def test_recipe_without_checkpoints_skips_the_out_check(monkeypatch, tmp_path):
    calls: list[Any] = []
    _install(monkeypatch, FakeEntryPoint("demo", "demo_pkg:R", lambda: _recorded_recipe("demo", calls, False)))
    checked: list[Any] = []
    monkeypatch.setattr(cli, "_check_out", checked.append)
    assert cli.main(["demo", "--out", str(tmp_path), "--device", "flex"]) == 0
    assert calls and not checked


@pytest.mark.parametrize("load, message", [
    (lambda: (_ for _ in ()).throw(ImportError("no module named demo_pkg")),
     "the 'demo' recipe (demo_pkg:R, entry-point group ember_train.recipes) failed to load: ImportError: no module"),
    (lambda: object(), "must name an ember_train.cli.Recipe called 'demo', got object"),
    (lambda: _recorded_recipe("other", []), "must name an ember_train.cli.Recipe called 'demo', got Recipe 'other'"),
], ids=["import-error", "not-a-recipe", "wrong-name"])
def test_broken_entry_point_is_a_clear_error(monkeypatch, capsys, load, message):
    _install(monkeypatch, FakeEntryPoint("demo", "demo_pkg:R", load))
    assert cli.run(cli.build_parser().parse_args(["demo"])) == 2
    assert message in capsys.readouterr().err


def test_unknown_name_lists_installed_recipes(monkeypatch):
    _install(monkeypatch)
    with pytest.raises(cli.RecipeUnavailableError, match="no recipe named 'nope' .*seed-cnn"):
        cli.recipe("nope")


def test_builtin_recipes_resolve_without_entry_points(monkeypatch):
    _install(monkeypatch)
    r = cli.recipe("seed-cnn-manual")
    assert r.run is cli.RECIPES["seed-cnn-manual"] and not r.checkpoints
    assert cli.recipe("seed-cnn").checkpoints


def test_a_package_cannot_shadow_a_builtin_recipe(monkeypatch):
    import importlib.metadata

    eps = [FakeEntryPoint("seed-cnn", "evil:R", object), FakeEntryPoint("demo", "demo_pkg:R", object)]
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: eps if group == cli.RECIPE_GROUP else [])
    assert sorted(cli._entry_points()) == ["demo"]
    assert cli.recipe("seed-cnn").run is cli.RECIPES["seed-cnn"]
