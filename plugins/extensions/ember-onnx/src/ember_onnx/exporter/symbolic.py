"""Dynamic axes: which literal ints of a captured graph follow an input dimension.

The graph is captured once at the example sizes and once more per dynamic axis with that axis one larger. Records
line up one to one (else the axis changes the graph's structure and export refuses it); an int literal that
changes is either proportional to the dimension (``c * D``: reshape targets such as ``batch * seq``) or moves with
it (``x0 + a * (D - s)``: slice ends, ``arange`` lengths). Both become small ONNX expressions over ``Shape`` of the
input, so the exported model runs at any size of that axis.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ember.ir import OpRecord, Ref, Scalar

from ..errors import ExportError

Path = tuple[Any, ...]


@dataclass(frozen=True)
class DimRef:
    """Dynamic dimension ``j``: input ``input_index``'s axis ``axis``, ``size`` in the base capture."""

    input_index: int
    axis: int
    size: int
    symbol: str


@dataclass(frozen=True)
class SymInt:
    """An int that depends on dynamic dims: ``coeff * prod(dims)`` or ``base + sum(a_j * (D_j - s_j))``."""

    kind: str  # "prod" or "lin"
    const: int
    terms: tuple[tuple[int, int], ...]  # prod: (j, 1) per dim; lin: (j, a_j)


def leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """(path, leaf) for every int leaf of a record argument (Ref indices excluded)."""
    if isinstance(value, Ref):
        return
    if isinstance(value, Scalar):
        if isinstance(value.value, int) and not isinstance(value.value, bool):
            yield path + ("scalar",), value.value
        return
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from leaves(v, path + (i,))
    elif isinstance(value, slice):
        for name in ("start", "stop", "step"):
            v = getattr(value, name)
            if isinstance(v, int) and not isinstance(v, bool):
                yield path + (name,), v
    elif hasattr(value, "args") and hasattr(value, "kwargs") and hasattr(value, "name"):  # ExtensionArgs
        yield from leaves(tuple(value.args), path + ("args",))
        for k, v in value.kwargs:
            yield from leaves(v, path + ("kwargs", k))


def solve(base: Sequence[OpRecord], variants: Sequence[Sequence[OpRecord]],
          dims: Sequence[DimRef]) -> dict[tuple[int, Path], SymInt]:
    """The symbolic ints of ``base``'s records, keyed by (record index, argument path)."""
    out: dict[tuple[int, Path], SymInt] = {}
    for j, var in enumerate(variants):
        if len(var) != len(base) or any(a.op != b.op for a, b in zip(base, var)):
            raise ExportError(f"ember_onnx.export: changing dynamic axis {dims[j].symbol!r} (input "
                              f"{dims[j].input_index}, dim {dims[j].axis}) changes the captured graph's ops; "
                              "that axis cannot be dynamic")
    for r, rec in enumerate(base):
        base_leaves = dict(leaves(tuple(rec.args)))
        if not base_leaves:
            continue
        var_leaves = [dict(leaves(tuple(v[r].args))) for v in variants]
        for path, x0 in base_leaves.items():
            changes = [(j, vl.get(path, x0)) for j, vl in enumerate(var_leaves) if vl.get(path, x0) != x0]
            if not changes:
                continue
            prod = all(xj * dims[j].size == x0 * (dims[j].size + 1) for j, xj in changes)
            denom = 1
            for j, _ in changes:
                denom *= dims[j].size
            if prod and x0 % denom == 0:
                out[(r, path)] = SymInt("prod", x0 // denom, tuple((j, 1) for j, _ in changes))
            else:
                out[(r, path)] = SymInt("lin", x0, tuple((j, xj - x0) for j, xj in changes))
    return out
