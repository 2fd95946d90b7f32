"""The supported-ops tables of the guide page (docs/plugins/onnx.md), generated from the op tables themselves;
a test keeps the page in sync with :func:`ops_tables`."""

from __future__ import annotations

from collections import defaultdict

#: the area names of the import table, in the order the guide lists them
AREA_TITLES = {"elementwise": "elementwise", "reduction": "reductions, softmax, TopK", "shape": "shape and indexing",
               "nn": "neural network", "recurrent": "recurrent", "resize": "resize and grid sampling",
               "quant": "quantization", "host": "data-dependent sizes, determinant",
               "control": "control flow, sequences, optionals"}


def import_table() -> str:
    """Markdown table: the ONNX ops with an import handler, per area."""
    from .importer import AREAS

    by_area: dict[str, list[str]] = defaultdict(list)
    for (domain, op), area in AREAS.items():
        by_area[area].append(op if not domain else f"{domain}::{op}")
    lines = ["| area | ONNX ops imported by a handler |", "| --- | --- |"]
    for area, title in AREA_TITLES.items():
        lines.append(f"| {title} | {', '.join(sorted(by_area.pop(area, [])))} |")
    for area, ops in sorted(by_area.items()):
        lines.append(f"| {area} | {', '.join(sorted(ops))} |")
    return "\n".join(lines)


def export_table() -> str:
    """Markdown table: the ember record ops (backend-contract methods) and extension ops export lowers."""
    from .exporter.lower import _BINARY, _UNARY, EXTENSION_RULES, RULES

    lines = ["| ember op | lowered to ONNX |", "| --- | --- |"]
    for op in sorted(RULES):
        note = (RULES[op].__doc__ or "").strip()
        if op == "binary":
            note += " Ops: " + ", ".join(sorted(_BINARY)) + ", ne, div, floor_divide, remainder, fmod, hypot."
        elif op == "unary":
            note += " Ops: " + ", ".join(sorted(_UNARY)) + ", rsqrt, expm1, log1p, log2, log10, exp2, erfc, trunc, " \
                "isfinite, isposinf, isneginf."
        lines.append(f"| `{op}` | {note} |")
    for name in sorted(EXTENSION_RULES):
        lines.append(f"| `{name}` (extension) | {(EXTENSION_RULES[name].__doc__ or '').strip()} |")
    return "\n".join(lines)


def ops_tables() -> str:
    """Both tables, as the guide page embeds them."""
    return "### Import\n\n" + import_table() + "\n\n### Export\n\n" + export_table() + "\n"
