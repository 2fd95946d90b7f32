"""``ember train lora`` (ember_lora.recipe): the entry point ember-train finds, the two tasks, and a --quick run's
table -- trainable fractions, memory, step time, accuracies above chance, the pre-trained model back with the
adapters off."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import numpy as np
import pytest

pytest.importorskip("ember_train")  # the recipe is ember-train's; ember-lora alone does not need it

from ember import cli as core_cli  # noqa: E402
from ember_lora import recipe as R  # noqa: E402
from ember_train import cli as train_cli  # noqa: E402


def test_registered_through_the_entry_point():
    names = {ep.name: ep.value for ep in entry_points(group=train_cli.RECIPE_GROUP)}
    assert names.get("lora") == "ember_lora.recipe:RECIPE"
    assert train_cli.recipe("lora") is R.RECIPE
    assert "lora" in train_cli.plugin_recipes()


def test_task_b_regroups_task_a_markers():
    size = R.sizes(quick=True)
    (xa, ya), (xb, yb) = R.tasks(size, seed=0)
    assert xa.shape == xb.shape == (size.n, size.seq_len) and ya.shape == yb.shape == (size.n,)
    per = (size.vocab - 1) // (2 * size.classes)
    markers = size.classes * per
    # both tasks plant tokens 1..markers only, and noise above them; token 0 (padding) never appears
    for x in (xa, xb):
        assert x.min() >= 1 and x.max() < size.vocab
    # in A, class c's sequences hold markers of block c; in B, the markers each class holds span several A blocks
    def blocks(x: np.ndarray, y: np.ndarray, c: int) -> set[int]:
        found = x[y == c]
        return {int((t - 1) // per) for t in found[found <= markers]}

    assert all(blocks(xa, ya, c) == {c} for c in range(size.classes))
    assert any(len(blocks(xb, yb, c)) > 1 for c in range(size.classes))
    (xa2, _), (xb2, _) = R.tasks(size, seed=0)
    np.testing.assert_array_equal(xb, xb2)  # seeded


def test_quick_run_table(tmp_path, capsys):
    out = tmp_path / "run"
    rc = core_cli.main(["train", "lora", "--quick", "--device", "flex", "--out", str(out), "--dashboard", "none"])
    text = capsys.readouterr().out
    assert rc == 0, text
    for column in R.HEADER:
        assert column in text
    assert "task B validation accuracy: full" in text and "time taken" in text
    results = json.loads((out / "lora-results.json").read_text())
    rows = {r["method"]: r for r in results["methods"]}
    assert list(rows) == ["full", "lora", "qlora"]
    full, lora, qlora = rows["full"], rows["lora"], rows["qlora"]
    # trainable fraction: everything for a full fine-tune, the same small share for LoRA and QLoRA
    assert full["trainable"] == full["total"] and full["trainable_fraction"] == 1.0
    assert lora["trainable"] == qlora["trainable"] and 0 < lora["trainable_fraction"] < 0.25
    # an NF4 base stores less than float32; a full fine-tune's step allocates gradients and Adam state for all
    assert qlora["weights_bytes"] < lora["weights_bytes"]
    assert full["step_peak_bytes"] > lora["step_peak_bytes"] > 0
    assert all(r["pool_kept_bytes"] is None for r in rows.values())  # ember-flex allocates with numpy: no pool
    for r in rows.values():
        assert r["step_ms"] is not None and r["step_ms"] > 0
        assert r["step_rss_bytes"] is None or r["step_rss_bytes"] >= 0
        assert r["accuracy_b"] > 1 / 4 + 0.05, r  # above chance (4 classes) on the new task
    # adapters off: LoRA's frozen base is the pre-trained model exactly
    assert lora["accuracy_a_base"] == pytest.approx(results["pretrained"]["accuracy_a"])
    assert full["accuracy_a_base"] is None and qlora["accuracy_a_base"] is not None
    for phase in ("pretrain", "full", "lora", "qlora"):
        assert (out / phase / "metrics.jsonl").is_file()
    # --resume picks every phase up from its checkpoints: nothing left to train, the same accuracies
    rc = train_cli.main(["lora", "--quick", "--resume", "--device", "flex", "--out", str(out), "--dashboard", "none"])
    assert rc == 0
    again = {r["method"]: r for r in json.loads((out / "lora-results.json").read_text())["methods"]}
    for method, r in rows.items():
        assert again[method]["accuracy_b"] == r["accuracy_b"] and again[method]["accuracy_a"] == r["accuracy_a"]
        assert again[method]["step_ms"] is None  # no step ran
    assert "n/a" in capsys.readouterr().out
