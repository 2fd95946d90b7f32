"""docs/plugins/onnx.md embeds the supported-ops tables generated from the op tables; keep them in sync."""

from __future__ import annotations

from pathlib import Path

from ember_onnx.coverage import ops_tables

PAGE = Path(__file__).resolve().parents[4] / "docs" / "plugins" / "onnx.md"


def test_guide_page_ops_tables_match_the_code() -> None:
    text = PAGE.read_text()
    start, end = "<!-- ops-table:start -->\n", "<!-- ops-table:end -->"
    embedded = text[text.index(start) + len(start):text.index(end)]
    assert embedded == ops_tables(), (
        "docs/plugins/onnx.md is out of date: replace the text between the ops-table markers with "
        "ember_onnx.coverage.ops_tables()")
