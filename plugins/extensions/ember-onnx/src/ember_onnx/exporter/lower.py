"""Lowering rules: one function per ``ember.ir`` record op (the backend-contract method) to ONNX nodes.

A rule gets the builder, the record and the ONNX names of the record's inputs, and returns the names of its
outputs. Extension ops (``op == "extension"``) use :data:`EXTENSION_RULES`, the op's own ``to_onnx`` rule, or else
the op's composition, captured and lowered in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ember
from ember.ir import OpRecord, Ref, Scalar

from ..dtypes import numpy_dtype
from ..errors import ExportError
from .builder import Builder

Rule = Callable[[Builder, OpRecord, list[str]], list[str]]
RULES: dict[str, Rule] = {}
#: extension op name -> rule(builder, record, ins, args, kwargs)
EXTENSION_RULES: dict[str, Callable[..., list[str]]] = {}


def rule(*ops: str) -> Callable[[Rule], Rule]:
    """Register a lowering for record ops ``ops``."""

    def deco(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return deco


def extension_rule(*names: str) -> Callable[[Callable[..., list[str]]], Callable[..., list[str]]]:
    """Register a lowering for extension ops ``names`` (``fn(b, record, ins, args, kwargs)``)."""

    def deco(fn: Callable[..., list[str]]) -> Callable[..., list[str]]:
        for n in names:
            EXTENSION_RULES[n] = fn
        return fn

    return deco


def _dtype_of(b: Builder, rec: OpRecord, a: Any) -> ember.DType:
    return b.dtypes[rec.inputs[a.k]]


def operand(b: Builder, rec: OpRecord, ins: list[str], a: Any, dtype: ember.DType) -> str:
    """A record operand as an ONNX name: a Ref's input, or a Python scalar as a constant of ``dtype``."""
    if isinstance(a, Ref):
        return ins[a.k]
    value = a.value if isinstance(a, Scalar) else a
    return b.scalar_like(value, dtype)


def _operand_dtype(b: Builder, rec: OpRecord, *args: Any) -> ember.DType:
    for a in args:
        if isinstance(a, Ref):
            return _dtype_of(b, rec, a)
    return rec.dtypes[0]


# -- elementwise ---------------------------------------------------------------------------------------------------
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "pow": "Pow", "maximum": "Max", "minimum": "Min",
           "fmax": "Max", "fmin": "Min", "eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
           "ge": "GreaterOrEqual", "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
           "bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor"}


@rule("binary")
def binary(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Add, Sub, Mul, Div, Pow, Max, Min, comparisons, And/Or/Xor, Bitwise*, Mod (and compositions)."""
    op, x, y = rec.args
    dt = _operand_dtype(b, rec, x, y)
    a, c = operand(b, rec, ins, x, dt), operand(b, rec, ins, y, dt)
    if op in ("logical_and", "logical_or", "logical_xor") and dt != ember.bool_:
        a, c = b.cast(a, ember.bool_), b.cast(c, ember.bool_)
    if op in _BINARY:
        return [b.one(_BINARY[op], [a, c])]
    if op == "ne":
        return [b.one("Not", [b.one("Equal", [a, c])])]
    if op == "div":
        out_dt = rec.dtypes[0]
        if out_dt != dt:
            a, c = b.cast(a, out_dt), b.cast(c, out_dt)
        return [b.one("Div", [a, c])]
    if op == "floor_divide":
        if dt.is_floating_point:
            return [b.one("Floor", [b.one("Div", [a, c])])]
        # integers: floor, not ONNX's truncation
        q = b.one("Div", [a, c])
        fix = b.one("And", [b.one("Not", [b.one("Equal", [b.one("Mul", [q, c]), a])]),
                            b.one("Xor", [b.one("Less", [a, b.scalar_like(0, dt)]),
                                          b.one("Less", [c, b.scalar_like(0, dt)])])])
        return [b.one("Sub", [q, b.cast(fix, dt)])]
    if op == "remainder":
        if not dt.is_floating_point:
            return [b.one("Mod", [a, c], fmod=0)]
        return [b.one("Sub", [a, b.one("Mul", [b.one("Floor", [b.one("Div", [a, c])]), c])])]
    if op == "fmod":
        return [b.one("Mod", [a, c], fmod=1)]
    if op == "hypot":
        return [b.one("Sqrt", [b.one("Add", [b.one("Mul", [a, a]), b.one("Mul", [c, c])])])]
    raise ExportError(f"ember_onnx.export: binary op {op!r} has no ONNX lowering")


_UNARY = {"abs": "Abs", "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sigmoid": "Sigmoid",
          "tanh": "Tanh", "sin": "Sin", "cos": "Cos", "tan": "Tan", "asin": "Asin", "acos": "Acos", "atan": "Atan",
          "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "erf": "Erf",
          "floor": "Floor", "ceil": "Ceil", "round": "Round", "sign": "Sign", "reciprocal": "Reciprocal",
          "logical_not": "Not", "isnan": "IsNaN", "isinf": "IsInf", "bitwise_not": "BitwiseNot"}


@rule("unary")
def unary(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """the ONNX op of the same name, or a short composition (rsqrt, expm1, log1p, ...)."""
    op, _ = rec.args
    x = ins[0]
    dt = b.dtypes[rec.inputs[0]]
    if op in _UNARY:
        if op == "logical_not" and dt != ember.bool_:
            x = b.cast(x, ember.bool_)
        return [b.one(_UNARY[op], [x])]
    one = b.scalar_like(1, dt) if dt.is_floating_point else None
    if op == "rsqrt":
        return [b.one("Reciprocal", [b.one("Sqrt", [x])])]
    if op == "expm1":
        return [b.one("Sub", [b.one("Exp", [x]), one])]
    if op == "log1p":
        return [b.one("Log", [b.one("Add", [x, one])])]
    if op in ("log2", "log10"):
        return [b.one("Div", [b.one("Log", [x]), b.scalar_like(math.log(2 if op == "log2" else 10), dt)])]
    if op == "exp2":
        return [b.one("Pow", [b.scalar_like(2.0, dt), x])]
    if op == "erfc":
        return [b.one("Sub", [one, b.one("Erf", [x])])]
    if op == "trunc":
        return [b.one("Mul", [b.one("Sign", [x]), b.one("Floor", [b.one("Abs", [x])])])]
    if op == "isfinite":
        return [b.one("Not", [b.one("Or", [b.one("IsNaN", [x]), b.one("IsInf", [x])])])]
    if op in ("isposinf", "isneginf"):
        return [b.one("IsInf", [x], detect_positive=int(op == "isposinf"), detect_negative=int(op == "isneginf"))]
    raise ExportError(f"ember_onnx.export: unary op {op!r} has no ONNX lowering")


@rule("relu")
def relu(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Relu."""
    return [b.one("Relu", [ins[0]])]


@rule("clamp")
def clamp(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Max / Min."""
    _, lo, hi = rec.args
    dt = b.dtypes[rec.inputs[0]]
    out = ins[0]
    if lo is not None:
        out = b.one("Max", [out, operand(b, rec, ins, lo, dt)])
    if hi is not None:
        out = b.one("Min", [out, operand(b, rec, ins, hi, dt)])
    return [out]


@rule("hardtanh")
def hardtanh(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Clip."""
    _, lo, hi = rec.args
    dt = b.dtypes[rec.inputs[0]]
    return [b.one("Clip", [ins[0], operand(b, rec, ins, lo, dt), operand(b, rec, ins, hi, dt)])]


@rule("where")
def where(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Where."""
    c, x, y = rec.args
    dt = rec.dtypes[0]
    return [b.one("Where", [ins[c.k], operand(b, rec, ins, x, dt), operand(b, rec, ins, y, dt)])]


@rule("masked_fill")
def masked_fill(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Where."""
    h, mask, value = rec.args
    dt = rec.dtypes[0]
    return [b.one("Where", [ins[mask.k], operand(b, rec, ins, value, dt), ins[h.k]])]


@rule("cast")
def cast(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Cast."""
    return [b.cast(ins[0], rec.args[1])]


@rule("copy", "contiguous", "keep_graph")
def identity(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Identity."""
    return [b.one("Identity", [ins[0]])]


# -- creation ------------------------------------------------------------------------------------------------------
@rule("full")
def full(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """a constant, or ConstantOfShape for a dynamic shape."""
    shape, value, dtype = rec.args
    value = value.value if isinstance(value, Scalar) else value
    if not b.is_dynamic((0,)):
        return [b.const(np.full(tuple(shape), value), dtype)]
    from onnx import numpy_helper

    arr = np.array([value]).astype(numpy_dtype(dtype))
    return [b.one("ConstantOfShape", [b.ints((0,), shape)], value=numpy_helper.from_array(arr))]


@rule("arange")
def arange(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """a constant, or Range for dynamic bounds."""
    start, stop, step, dtype = rec.args
    if not b.is_dynamic(()):
        return [b.const(np.arange(start, stop, step), dtype)]
    out = b.one("Range", [b.scalar_int((0,), start), b.scalar_int((1,), stop), b.scalar_int((2,), step)])
    return [out if dtype == ember.int64 else b.cast(out, dtype)]


# -- shape ---------------------------------------------------------------------------------------------------------
@rule("reshape")
def reshape(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Reshape (a computed shape for dynamic axes)."""
    return [b.one("Reshape", [ins[0], b.ints((1,), rec.args[1])])]


@rule("permute")
def permute(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Transpose."""
    return [b.one("Transpose", [ins[0]], perm=list(rec.args[1]))]


@rule("expand")
def expand(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Expand."""
    return [b.one("Expand", [ins[0], b.ints((1,), rec.args[1])])]


@rule("cat")
def cat(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Concat."""
    hs, dim = rec.args
    return [b.one("Concat", [ins[h.k] for h in hs], axis=dim)]


@rule("flip")
def flip(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Slice with step -1."""
    _, dims = rec.args
    big = np.iinfo(np.int64).max
    n = len(dims)
    return [b.one("Slice", [ins[0], b.const(np.full(n, -1, np.int64)), b.const(np.full(n, -big, np.int64)),
                            b.const(np.array(dims, np.int64)), b.const(np.full(n, -1, np.int64))])]


@rule("getitem")
def getitem(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Slice, Gather, Squeeze, Unsqueeze."""
    h, key = rec.args
    rank = len(b.shapes[rec.inputs[0]])
    key = tuple(key)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    expanded: list[tuple[int, Any]] = []  # (key position, entry) with Ellipsis expanded to full slices
    for pos, k in enumerate(key):
        if k is Ellipsis:
            expanded += [(-1, slice(None))] * (rank - n_real)
        else:
            expanded.append((pos, k))
    expanded += [(-1, slice(None))] * (rank - sum(1 for _, k in expanded if k is not None))
    out = ins[0]
    starts, ends, axes, steps, squeeze, unsqueeze = [], [], [], [], [], []
    gathers: list[tuple[int, str]] = []
    dim = 0
    out_dim = 0
    for pos, k in expanded:
        if k is None:
            unsqueeze.append(out_dim)
            out_dim += 1
            continue
        if isinstance(k, slice):
            if k != slice(None) and not (k.start in (None, 0) and k.stop is None and k.step in (None, 1)):
                st = k.step if k.step is not None else 1
                big = np.iinfo(np.int64).max
                starts.append(b.sym((1, pos, "start"), k.start) if k.start is not None else (0 if st > 0 else -1))
                ends.append(b.sym((1, pos, "stop"), k.stop) if k.stop is not None else (big if st > 0 else -big))
                axes.append(dim)
                steps.append(st)
            dim += 1
            out_dim += 1
        elif isinstance(k, Ref):
            gathers.append((dim, ins[k.k]))
            dim += 1
            out_dim += len(b.shapes[rec.inputs[k.k]])
        elif isinstance(k, int):
            starts.append(b.sym((1, pos), k))
            ends.append(k + 1 if k != -1 else np.iinfo(np.int64).max)
            axes.append(dim)
            steps.append(1)
            squeeze.append(dim)
            dim += 1
        else:
            raise ExportError(f"ember_onnx.export: getitem key entry {k!r} has no ONNX lowering")
    if starts:
        def vec(vals: list[Any]) -> str:
            if all(isinstance(v, (int, np.integer)) for v in vals):
                return b.const(np.array(vals, np.int64))
            return b.one("Concat", [v if isinstance(v, str) else b.const(np.array([v], np.int64)) for v in vals],
                         axis=0)

        out = b.one("Slice", [out, vec(starts), vec(ends), b.const(np.array(axes, np.int64)),
                              b.const(np.array(steps, np.int64))])
    if len(gathers) > 1:
        raise ExportError("ember_onnx.export: getitem with several index tensors has no ONNX lowering")
    for d, idx in gathers:
        out = b.one("Gather", [out, idx], axis=d - sum(1 for s in squeeze if s < d))
    if squeeze:
        out = b.one("Squeeze", [out, b.const(np.array(squeeze, np.int64))])
    if unsqueeze:
        out = b.one("Unsqueeze", [out, b.const(np.array(unsqueeze, np.int64))])
    return [out]


# -- reductions and friends ----------------------------------------------------------------------------------------
_REDUCE = {"sum": "ReduceSum", "prod": "ReduceProd", "max": "ReduceMax", "min": "ReduceMin", "mean": "ReduceMean"}


def reduce_node(b: Builder, op_type: str, x: str, dims: Sequence[int], keepdim: bool) -> str:
    """A reduction over ``dims`` with axes as an input (ReduceSum from 13, the others from 18) or attribute."""
    if op_type == "ReduceSum" or b.opset >= 18:
        return b.one(op_type, [x, b.const(np.array(list(dims), np.int64))], keepdims=int(keepdim))
    return b.one(op_type, [x], axes=list(dims), keepdims=int(keepdim))


@rule("reduce")
def reduce(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """ReduceSum, ReduceProd, ReduceMax, ReduceMin."""
    op, _, dims, keepdim = rec.args
    x = ins[0]
    if b.dtypes[rec.inputs[0]] == ember.bool_:
        x = b.cast(x, ember.int64)
        return [b.cast(reduce_node(b, _REDUCE[op], x, dims, keepdim), ember.bool_)]
    return [reduce_node(b, _REDUCE[op], x, dims, keepdim)]


@rule("logsumexp")
def logsumexp(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """ReduceLogSumExp."""
    _, dims, keepdim = rec.args
    return [reduce_node(b, "ReduceLogSumExp", ins[0], dims, keepdim)]


@rule("argreduce")
def argreduce(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """ArgMax, ArgMin."""
    op, _, dim, keepdim = rec.args
    x = ins[0]
    if dim is None:
        x = b.one("Reshape", [x, b.const(np.array([-1], np.int64))])
        dim = 0
    return [b.one("ArgMax" if op == "argmax" else "ArgMin", [x], axis=dim, keepdims=int(keepdim))]


@rule("cumulative")
def cumulative(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """CumSum."""
    op, _, dim = rec.args
    if op != "sum":
        raise ExportError(f"ember_onnx.export: cumulative {op!r} has no ONNX lowering (only sum)")
    return [b.one("CumSum", [ins[0], b.const(np.array(dim, np.int64))])]


@rule("softmax")
def softmax(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Softmax, LogSoftmax."""
    _, dim, log = rec.args
    return [b.one("LogSoftmax" if log else "Softmax", [ins[0]], axis=dim)]


@rule("matmul")
def matmul(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """MatMul."""
    return [b.one("MatMul", [ins[0], ins[1]])]


@rule("einsum")
def einsum(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Einsum."""
    return [b.one("Einsum", ins, equation=rec.args[0])]


@rule("sort")
def sort(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """TopK over the whole axis."""
    _, dim, descending, _stable = rec.args
    n = b.shapes[rec.inputs[0]][dim]
    return b.node("TopK", [ins[0], b.const(np.array([n], np.int64))], 2, axis=dim, largest=int(descending),
                  sorted=1)


@rule("topk")
def topk(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """TopK."""
    _, k, dim, largest, sorted_ = rec.args
    return b.node("TopK", [ins[0], b.const(np.array([k], np.int64))], 2, axis=dim, largest=int(largest),
                  sorted=int(sorted_))


@rule("gather")
def gather(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """GatherElements."""
    return [b.one("GatherElements", [ins[0], ins[1]], axis=rec.args[1])]


@rule("index_select")
def index_select(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Gather."""
    return [b.one("Gather", [ins[0], ins[1]], axis=rec.args[1])]


@rule("embedding")
def embedding(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Gather."""
    w, idx, _ = rec.args
    return [b.one("Gather", [ins[w.k], ins[idx.k]], axis=0)]


@rule("tril")
def tril(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Trilu."""
    _, diagonal, upper = rec.args
    return [b.one("Trilu", [ins[0], b.const(np.array(diagonal, np.int64))], upper=int(upper))]


@rule("pad")
def pad(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Pad (constant, reflect, edge, wrap)."""
    _, pads, mode, value = rec.args
    onnx_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    p = [lo for lo, _ in pads] + [hi for _, hi in pads]
    inputs = [ins[0], b.const(np.array(p, np.int64))]
    if mode == "constant":
        v = value.value if isinstance(value, Scalar) else value
        inputs.append(b.scalar_like(v if v is not None else 0, b.dtypes[rec.inputs[0]]))
    return [b.one("Pad", inputs, mode=onnx_mode)]


# -- convolution and pooling ---------------------------------------------------------------------------------------
@rule("conv")
def conv(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Conv."""
    x, w, bias, stride, padding, dilation, groups = rec.args
    inputs = [ins[x.k], ins[w.k]] + ([ins[bias.k]] if bias is not None else [])
    pads = [lo for lo, _ in padding] + [hi for _, hi in padding]
    return [b.one("Conv", inputs, strides=list(stride), pads=pads, dilations=list(dilation), group=groups,
                  kernel_shape=list(b.shapes[rec.inputs[w.k]][2:]))]


@rule("conv_transpose")
def conv_transpose(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """ConvTranspose."""
    x, w, bias, stride, padding, output_padding, dilation, groups = rec.args
    inputs = [ins[x.k], ins[w.k]] + ([ins[bias.k]] if bias is not None else [])
    return [b.one("ConvTranspose", inputs, strides=list(stride), pads=list(padding) * 2,
                  output_padding=list(output_padding), dilations=list(dilation), group=groups,
                  kernel_shape=list(b.shapes[rec.inputs[w.k]][2:]))]


@rule("max_pool")
def max_pool(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """MaxPool."""
    _, kernel, stride, padding, dilation, ceil_mode, return_indices = rec.args
    if return_indices:
        raise ExportError("ember_onnx.export: max_pool with return_indices has no ONNX lowering "
                          "(ONNX indices count over the whole tensor, torch's per plane)")
    return [b.one("MaxPool", [ins[0]], kernel_shape=list(kernel), strides=list(stride), pads=list(padding) * 2,
                  dilations=list(dilation), ceil_mode=int(ceil_mode))]


@rule("avg_pool")
def avg_pool(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """AveragePool."""
    _, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override = rec.args
    if divisor_override is not None:
        raise ExportError("ember_onnx.export: avg_pool with divisor_override has no ONNX lowering")
    return [b.one("AveragePool", [ins[0]], kernel_shape=list(kernel), strides=list(stride), pads=list(padding) * 2,
                  ceil_mode=int(ceil_mode), count_include_pad=int(count_include_pad))]


@rule("adaptive_avg_pool", "adaptive_max_pool")
def adaptive_pool(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """GlobalAveragePool/GlobalMaxPool, or a pool with an even window."""
    sizes = b.shapes[rec.inputs[0]][2:]
    out = rec.args[1]
    is_max = rec.op == "adaptive_max_pool"
    if is_max and rec.args[2]:
        raise ExportError("ember_onnx.export: adaptive_max_pool with return_indices has no ONNX lowering")
    if all(o == 1 for o in out):
        return [b.one("GlobalMaxPool" if is_max else "GlobalAveragePool", [ins[0]])]
    if any(s % o for s, o in zip(sizes, out)):
        raise ExportError(f"ember_onnx.export: {rec.op} from {tuple(sizes)} to {tuple(out)} (not a divisor) has "
                          "no ONNX lowering")
    k = [s // o for s, o in zip(sizes, out)]
    return [b.one("MaxPool" if is_max else "AveragePool", [ins[0]], kernel_shape=k, strides=k)]


@rule("interpolate")
def interpolate(b: Builder, rec: OpRecord, ins: list[str]) -> list[str]:
    """Resize."""
    _, size, mode, align_corners, _scales = rec.args
    onnx_mode = {"nearest": "nearest", "bilinear": "linear", "linear": "linear", "trilinear": "linear",
                 "bicubic": "cubic"}.get(mode)
    if onnx_mode is None:
        raise ExportError(f"ember_onnx.export: interpolate mode {mode!r} has no ONNX lowering")
    coord = "asymmetric" if mode == "nearest" else ("align_corners" if align_corners else "pytorch_half_pixel")
    if _scales is not None:
        # the scale factors keep torch's coordinate mapping and leave batch and channels free
        inputs = [ins[0], "", b.const(np.array([1.0, 1.0] + [float(v) for v in _scales], np.float32))]
    else:
        lead = b.one("Slice", [b.one("Shape", [ins[0]]), b.const(np.array([0], np.int64)),
                               b.const(np.array([2], np.int64))])
        inputs = [ins[0], "", "", b.one("Concat", [lead, b.const(np.array(list(size), np.int64))], axis=0)]
    return [b.one("Resize", inputs, mode=onnx_mode, coordinate_transformation_mode=coord,
                  nearest_mode="floor" if mode == "nearest" else None,
                  cubic_coeff_a=-0.75 if onnx_mode == "cubic" else None)]


# -- extension ops -------------------------------------------------------------------------------------------------
@extension_rule("nn.gelu")
def gelu(b: Builder, rec: OpRecord, ins: list[str], args: Sequence[Any], kwargs: dict[str, Any]) -> list[str]:
    """Gelu (opset 20+) or its Erf/Tanh composition."""
    x = ins[args[0].k]
    dt = b.dtypes[rec.inputs[args[0].k]]
    approximate = kwargs.get("approximate", "none")
    if b.opset >= 20:
        return [b.one("Gelu", [x], approximate=approximate)]
    half = b.scalar_like(0.5, dt)
    one = b.scalar_like(1.0, dt)
    if approximate == "tanh":
        cube = b.one("Mul", [b.one("Mul", [x, x]), x])
        inner = b.one("Mul", [b.scalar_like(math.sqrt(2 / math.pi), dt),
                              b.one("Add", [x, b.one("Mul", [b.scalar_like(0.044715, dt), cube])])])
        return [b.one("Mul", [b.one("Mul", [half, x]), b.one("Add", [one, b.one("Tanh", [inner])])])]
    erf = b.one("Erf", [b.one("Div", [x, b.scalar_like(math.sqrt(2.0), dt)])])
    return [b.one("Mul", [b.one("Mul", [half, x]), b.one("Add", [one, erf])])]


@extension_rule("nn.layer_norm")
def layer_norm(b: Builder, rec: OpRecord, ins: list[str], args: Sequence[Any], kwargs: dict[str, Any]) -> list[str]:
    """LayerNormalization (Y, Mean, InvStdDev)."""
    x, w, bias = args[:3]
    shape = tuple(kwargs["normalized_shape"])
    dt = b.dtypes[rec.inputs[x.k]]
    scale = ins[w.k] if w is not None else b.const(np.ones(shape), dt)
    inputs = [ins[x.k], scale] + ([ins[bias.k]] if bias is not None else [])
    rank = len(b.shapes[rec.inputs[x.k]])
    return b.node("LayerNormalization", inputs, 3, axis=rank - len(shape), epsilon=kwargs.get("eps", 1e-5))


@extension_rule("nn.scaled_dot_product_attention", "nn.scaled_dot_product_attention_out")
def sdpa(b: Builder, rec: OpRecord, ins: list[str], args: Sequence[Any], kwargs: dict[str, Any]) -> list[str]:
    """MatMul, Softmax, Where/Add for masks (the weights are the second output; the `_out` op has none)."""
    q, k, v, mask, dropout_mask = args[:5]
    if dropout_mask is not None:
        raise ExportError("ember_onnx.export: attention dropout in the graph (export in eval mode)")
    if kwargs.get("repeat_k", 1) != 1 or kwargs.get("repeat_v", 1) != 1:
        raise ExportError("ember_onnx.export: grouped-query attention (repeat_k/repeat_v) has no lowering yet")
    dt = b.dtypes[rec.inputs[q.k]]
    q_shape = b.shapes[rec.inputs[q.k]]
    k_shape = b.shapes[rec.inputs[k.k]]
    rank = len(k_shape)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scores = b.one("MatMul", [ins[q.k], b.one("Transpose", [ins[k.k]], perm=perm)])
    scores = b.one("Mul", [scores, b.scalar_like(kwargs["scale"], dt)])
    ninf = b.scalar_like(-np.inf, dt)
    if kwargs.get("is_causal"):
        L, S = q_shape[-2], k_shape[-2]
        keep = b.const(np.tril(np.ones((L, S), dtype=bool)))
        scores = b.one("Where", [keep, scores, ninf])
    elif mask is not None and b.dtypes[rec.inputs[mask.k]] == ember.bool_:
        scores = b.one("Where", [ins[mask.k], scores, ninf])
    elif mask is not None:
        scores = b.one("Add", [scores, ins[mask.k]])
    attn = b.one("Softmax", [scores], axis=-1)
    # safe softmax: fully masked rows give zeros (as ember's kernel), not NaN
    all_masked = b.one("Equal", [reduce_node(b, "ReduceMax", scores, [-1], True), ninf])
    attn = b.one("Where", [all_masked, b.scalar_like(0.0, dt), attn])
    return [b.one("MatMul", [attn, ins[v.k]]), attn]

