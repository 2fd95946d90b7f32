"""Sphinx extension: the ``ember-ops`` directive writes the elementwise op tables from the op registry
(:mod:`ember.opinfo`), so the docs list exactly the ops, aliases, methods, operators and dtype rules the code has.

Three tables: the unary primitives and the binary primitives of the backend contract (the names ``Backend.unary``
and ``Backend.binary`` receive), then the pointwise compositions written in those primitives. The generated text is
MyST Markdown, parsed in place of the directive; use the directive from a Markdown page (docs/ops.md).
"""

from __future__ import annotations

from typing import Any

_GRAD = {"smooth": "yes", "zero": "zero (step function)", "none": "no"}


def _code(names: Any) -> str:
    return ", ".join(f"`{n}`" for n in names) if names else ""


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return [*lines, ""]


def _doc(text: str) -> str:
    # the registry's one-liners use reST literals; the tables are Markdown, where ``*`` would start emphasis
    return text.replace("``", "`").replace("*", "\\*")


def render_markdown() -> str:
    """The op tables, as MyST Markdown."""
    from ember import opinfo

    lines: list[str] = []
    rules = [(f"`{name}`", text) for name, text in opinfo.DTYPE_RULES.items()]
    lines += ["```{rubric} Dtype rules", "```", ""]
    lines += _table(("Rule", "Result dtype"), rules)
    for title, arity in (("Unary primitives (Backend.unary)", 1), ("Binary primitives (Backend.binary)", 2)):
        rows = []
        for op in opinfo.select(arity=arity, kind="primitive"):
            rows.append((f"`{op.name}`", f"`{op.dtypes}`", _code(op.aliases), _code(op.methods),
                         _code(op.operators), _GRAD[op.grad], opinfo.DOMAINS[op.domain] if arity == 1 else
                         ("" if op.int_rhs is None else f"integer right operand: {op.int_rhs}"), _doc(op.doc)))
        lines += [f"```{{rubric}} {title}", "```", ""]
        lines += _table(("Op", "Dtype rule", "Aliases", "Tensor methods", "Operators", "Gradient",
                         "Domain" if arity == 1 else "Kit samples", "Computes"), rows)
    rows = []
    for op in opinfo.select(kind="composition"):
        rows.append((f"`{op.name}`", str(op.arity), f"`{op.dtypes}`", _code(op.aliases), _code(op.methods),
                     _GRAD[op.grad], f"`{op.module}`", _doc(op.doc)))
    lines += ["```{rubric} Compositions", "```", ""]
    lines += _table(("Op", "Operands", "Dtype rule", "Aliases", "Tensor methods", "Gradient", "Module", "Computes"),
                    rows)
    return "\n".join(lines)


def setup(app: Any) -> dict[str, Any]:
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class OpsDirective(SphinxDirective):
        has_content = False

        def run(self) -> list[Any]:
            from docutils import nodes

            from ember import opinfo

            self.env.note_dependency(opinfo.__file__)
            container = nodes.container()
            self.state.nested_parse(StringList(render_markdown().splitlines(), source="ember/opinfo.py"),
                                    self.content_offset, container)
            return container.children

    app.add_directive("ember-ops", OpsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
