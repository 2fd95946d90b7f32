"""Control flow, sequences and optionals: If, Loop, Scan, Sequence*, Optional*.

Subgraphs run through the executor (``node.run_subgraph``) and see the enclosing scope's names. ONNX sequences are
Python lists of tensors; an empty optional is ``None``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ember
from ember import Tensor

from .registry import Node, host_ints, host_scalar, norm_axis, register


@register("If")
def if_(node: Node, cond: Tensor) -> tuple[Any, ...]:
    branch = node.attr("then_branch") if bool(host_scalar(cond)) else node.attr("else_branch")
    return tuple(node.run_subgraph(branch, {}))


def _stack(values: list[Tensor], axis: int = 0) -> Tensor:
    return ember.stack(values, dim=axis)


@register("Loop")
def loop(node: Node, max_trips: Tensor | None, cond: Tensor | None, *carried: Any) -> tuple[Any, ...]:
    body = node.attr("body")
    names = [i.name for i in body.input]
    n_carried = len(carried)
    trips = int(host_scalar(max_trips)) if max_trips is not None else None
    keep_going = bool(host_scalar(cond)) if cond is not None else True
    state = list(carried)
    scans: list[list[Any]] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    i = 0
    while keep_going and (trips is None or i < trips):
        feeds = {names[0]: node.const(np.array(i, dtype=np.int64)),
                 names[1]: node.const(np.array(keep_going, dtype=np.bool_))}
        feeds.update(zip(names[2:], state))
        outs = node.run_subgraph(body, feeds)
        keep_going = bool(host_scalar(outs[0]))
        state = list(outs[1:1 + n_carried])
        for acc, v in zip(scans, outs[1 + n_carried:]):
            acc.append(v)
        i += 1
    stacked = []
    for acc in scans:
        stacked.append(_stack(acc) if acc else node.const(np.zeros((0,), dtype=np.float32)))
    return tuple(state + stacked)


@register("Scan")
def scan(node: Node, *inputs: Any) -> tuple[Any, ...]:
    if node.opset < 9:
        raise node.fail("Scan-8 (with sequence_lens and a batch axis) is not supported; use opset 9 or later")
    body = node.attr("body")
    n_scan = node.attr("num_scan_inputs")
    n_state = len(inputs) - n_scan
    state, xs = list(inputs[:n_state]), list(inputs[n_state:])
    in_axes = [norm_axis(a, x.dim()) for a, x in zip(node.attr("scan_input_axes") or [0] * n_scan, xs)]
    in_dirs = node.attr("scan_input_directions") or [0] * n_scan
    n_out = len(body.output) - n_state
    out_axes = list(node.attr("scan_output_axes") or [0] * n_out)
    out_dirs = node.attr("scan_output_directions") or [0] * n_out
    names = [i.name for i in body.input]
    steps = xs[0].shape[in_axes[0]] if xs else 0
    outs_acc: list[list[Tensor]] = [[] for _ in range(n_out)]
    for t in range(steps):
        feeds = dict(zip(names[:n_state], state))
        for name, x, ax, rev in zip(names[n_state:], xs, in_axes, in_dirs):
            feeds[name] = ember.select(x, ax, steps - 1 - t if rev else t)
        outs = node.run_subgraph(body, feeds)
        state = list(outs[:n_state])
        for acc, v in zip(outs_acc, outs[n_state:]):
            acc.append(v)
    results: list[Any] = list(state)
    for acc, ax, rev in zip(outs_acc, out_axes, out_dirs):
        seq = acc[::-1] if rev else acc
        results.append(_stack(seq, norm_axis(ax, seq[0].dim() + 1)))
    return tuple(results)


# -- sequences ----------------------------------------------------------------------------------------------------
@register("SequenceEmpty")
def sequence_empty(node: Node) -> list[Tensor]:
    return []


@register("SequenceConstruct")
def sequence_construct(node: Node, *xs: Tensor) -> list[Tensor]:
    return list(xs)


def _pos(pos: Tensor | None, n: int, default: int) -> int:
    p = int(host_scalar(pos)) if pos is not None else default
    return p + n if p < 0 else p


@register("SequenceInsert")
def sequence_insert(node: Node, seq: list[Tensor], t: Tensor, pos: Tensor | None = None) -> list[Tensor]:
    out = list(seq)
    out.insert(_pos(pos, len(seq), len(seq)), t)
    return out


@register("SequenceAt")
def sequence_at(node: Node, seq: list[Tensor], pos: Tensor) -> Tensor:
    return seq[_pos(pos, len(seq), 0)]


@register("SequenceErase")
def sequence_erase(node: Node, seq: list[Tensor], pos: Tensor | None = None) -> list[Tensor]:
    out = list(seq)
    del out[_pos(pos, len(seq), len(seq) - 1)]
    return out


@register("SequenceLength")
def sequence_length(node: Node, seq: list[Tensor]) -> Tensor:
    return node.const(np.array(len(seq), dtype=np.int64))


@register("SplitToSequence")
def split_to_sequence(node: Node, x: Tensor, split: Tensor | None = None) -> list[Tensor]:
    axis = norm_axis(node.attr("axis", 0), x.dim())
    if split is None:
        parts = list(ember.split(x, 1, dim=axis))
        return [p.squeeze(axis) for p in parts] if not node.attr("keepdims", 1) else parts
    sizes = host_ints(split)
    if split.dim() == 0:
        return list(ember.split(x, sizes[0], dim=axis))
    return list(ember.split(x, sizes, dim=axis))


@register("ConcatFromSequence")
def concat_from_sequence(node: Node, seq: list[Tensor]) -> Tensor:
    if node.attr("new_axis", 0):
        return ember.stack(seq, dim=norm_axis(node.attr("axis"), seq[0].dim() + 1))
    return ember.cat(seq, dim=norm_axis(node.attr("axis"), seq[0].dim()))


@register("SequenceMap")
def sequence_map(node: Node, seq: list[Tensor], *extra: Any) -> tuple[Any, ...]:
    body = node.attr("body")
    names = [i.name for i in body.input]
    n = len(seq)
    outs: list[list[Tensor]] = [[] for _ in body.output]
    for i in range(n):
        feeds = {names[0]: seq[i]}
        for name, e in zip(names[1:], extra):
            feeds[name] = e[i] if isinstance(e, list) else e
        for acc, v in zip(outs, node.run_subgraph(body, feeds)):
            acc.append(v)
    return tuple(outs)


# -- optionals ----------------------------------------------------------------------------------------------------
@register("Optional")
def optional(node: Node, x: Any = None) -> Any:
    return x


@register("OptionalHasElement")
def optional_has_element(node: Node, x: Any = None) -> Tensor:
    return ember.tensor(x is not None, device=node.device)


@register("OptionalGetElement")
def optional_get_element(node: Node, x: Any) -> Any:
    if x is None:
        raise node.fail("the optional is empty")
    return x
