"""``ember_onnx.export``: capture a model with ``ember.capture`` and lower its records to an ONNX model."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
from onnx import helper

import ember
from ember import Tensor, nn
from ember.ir import OpRecord, Ref

from ..errors import ExportError
from .builder import Builder, value_info
from .lower import EXTENSION_RULES, RULES
from .symbolic import DimRef, solve

#: opsets export accepts (ONNX's newest operator definitions used here exist from 17; onnxruntime runs up to 23)
SUPPORTED_OPSETS = range(17, 24)
#: ONNX's protobuf limit: larger models keep their initializers in an external data file
_TWO_GB = 2**31 - 1


def _grown(x: Tensor, axis: int) -> Tensor:
    """``x`` one longer along ``axis`` (its first slice repeated: valid data for token ids too)."""
    return ember.cat([x, ember.narrow(x, axis, 0, 1)], dim=axis)


def _dynamic(dynamic_axes: Mapping[str, Any] | None, input_names: Sequence[str],
             inputs: Sequence[Tensor]) -> list[DimRef]:
    dims: list[DimRef] = []
    for name, spec in (dynamic_axes or {}).items():
        if name not in input_names:
            continue  # output axes follow from the inputs'
        i = list(input_names).index(name)
        axes = spec.items() if isinstance(spec, Mapping) else ((a, f"{name}_dim{a}") for a in spec)
        for axis, symbol in axes:
            axis = axis + inputs[i].dim() if axis < 0 else axis
            dims.append(DimRef(i, axis, int(inputs[i].shape[axis]), str(symbol)))
    return dims


def _capture(fn: Callable[..., Any], inputs: Sequence[Tensor]) -> Any:
    return ember.capture(fn, *inputs)


def _lower_extension(b: Builder, rec: OpRecord, ins: list[str], dynamic: bool) -> list[str]:
    ext = rec.args[0]
    kwargs = dict(ext.kwargs)
    fn = EXTENSION_RULES.get(ext.name)
    if fn is not None:
        return fn(b, rec, ins, tuple(ext.args), kwargs)
    op = ember.extension.get(ext.name)
    own = getattr(op, "to_onnx", None) if op is not None else None
    if own is not None:
        return list(own(b, rec, ins, tuple(ext.args), kwargs))
    if op is None or dynamic:
        raise ExportError(f"ember_onnx.export: extension op {ext.name!r} has no ONNX rule (give the extension a "
                          "to_onnx rule or register one with ember_onnx.exporter.lower.extension_rule)"
                          + (" and its composition cannot be inlined with dynamic axes" if dynamic else ""))
    return _inline_composition(b, rec, ins, op, ext, kwargs)


def _inline_composition(b: Builder, rec: OpRecord, ins: list[str], op: Any, ext: Any,
                        kwargs: dict[str, Any]) -> list[str]:
    """Lower an extension op by capturing its composition (ember ops) on the record's input specs."""
    specs = []
    positions = []
    for i, a in enumerate(ext.args):
        if isinstance(a, Ref):
            vid = rec.inputs[a.k]
            specs.append(ember.TensorSpec(tuple(b.shapes[vid]), b.dtypes[vid]))
            positions.append(i)

    def call(*tensors: Tensor) -> Any:
        args = list(ext.args)
        for pos, t in zip(positions, tensors):
            args[pos] = t
        return op.composition(*args, **kwargs)

    try:
        inner = ember.capture(call, *specs, device=b.device)
    except Exception as exc:  # noqa: BLE001 - any capture failure means: no lowering
        raise ExportError(f"ember_onnx.export: extension op {ext.name!r} has no ONNX rule and its composition "
                          f"could not be captured ({type(exc).__name__}: {exc})") from exc
    saved = b.record_index
    b.record_index = -1  # the composition's literals are static
    for gv, a in zip(inner.inputs, [a for a in ext.args if isinstance(a, Ref)]):
        b.names[("inner", id(inner), gv.id)] = ins[a.k]
    for gv in inner.constants:
        b.names[("inner", id(inner), gv.id)] = b.const(gv.tensor.detach().numpy())
    for vid, shape in inner.shapes.items():
        b.shapes[("inner", id(inner), vid)] = shape
    for vid, dt in inner.dtypes.items():
        b.dtypes[("inner", id(inner), vid)] = dt
    for r in inner.records:
        mapped = r._replace(inputs=tuple(("inner", id(inner), v) for v in r.inputs),
                            outputs=tuple(("inner", id(inner), v) for v in r.outputs))
        _lower_record(b, mapped, dynamic=False)
    b.record_index = saved
    return [b.names[("inner", id(inner), v)] for v in inner.outputs]


def _lower_record(b: Builder, rec: OpRecord, dynamic: bool) -> None:
    ins = [b.names[v] for v in rec.inputs]
    if rec.op == "extension":
        outs = _lower_extension(b, rec, ins, dynamic)
    else:
        fn = RULES.get(rec.op)
        if fn is None:
            raise ExportError(f"ember_onnx.export: the contract op {rec.op!r} has no ONNX lowering "
                              f"(record args {rec.args!r:.200})")
        outs = fn(b, rec, ins)
    for vid, name in zip(rec.outputs, outs):
        b.names[vid] = name


def export(model_or_fn: nn.Module | Callable[..., Any], example_inputs: Tensor | Sequence[Tensor],
           path: str | os.PathLike[str] | None = None, opset: int = 18, input_names: Sequence[str] | None = None,
           output_names: Sequence[str] | None = None, dynamic_axes: Mapping[str, Any] | None = None,
           dtype: ember.DType | None = None) -> onnx.ModelProto:
    """Export an ember model (or a function of tensors) to ONNX.

    The model runs once under ``ember.capture`` on ``example_inputs`` (an ``nn.Module`` in eval mode: dropout is
    the identity and batch norm uses its running statistics; its mode is restored afterwards). Parameters and
    buffers become initializers named as in ``state_dict``. ``dynamic_axes`` maps an input name to the axes that
    may change size (``{"input": {0: "batch"}}`` or ``{"input": [0]}``); those become symbolic dims. The model is
    checked with ``onnx.checker.check_model(full_check=True)`` (shape inference included) before it is returned and,
    with ``path``, saved (with external data when over 2 GB). ``dtype`` casts floating-point initializers and
    inputs (e.g. ``ember.float16``); default: as the model is.
    """
    if opset not in SUPPORTED_OPSETS:
        raise ember.errors.ValueRangeError(f"ember_onnx.export: opset {opset} is not supported "
                                           f"({SUPPORTED_OPSETS.start}-{SUPPORTED_OPSETS.stop - 1})")
    inputs = [example_inputs] if isinstance(example_inputs, Tensor) else list(example_inputs)
    if not all(isinstance(t, Tensor) for t in inputs):
        raise ember.errors.DTypeError("ember_onnx.export: example_inputs must be ember tensors")
    if dtype is not None:
        inputs = [t.to(dtype) if t.dtype.is_floating_point else t for t in inputs]
    names_in = list(input_names) if input_names is not None else [f"input{i}" if i else "input"
                                                                  for i in range(len(inputs))]
    if len(names_in) != len(inputs):
        raise ember.errors.ShapeError(f"ember_onnx.export: {len(names_in)} input_names for {len(inputs)} inputs")
    module = model_or_fn if isinstance(model_or_fn, nn.Module) else None
    was_training = bool(module is not None and module.training)
    restore_dtype = None
    if module is not None:
        module.eval()
        if dtype is not None:
            restore_dtype = next((p.dtype for p in module.parameters() if p.dtype.is_floating_point), None)
            module.to(dtype=dtype)
    try:
        graph = _capture(model_or_fn, inputs)
        dims = _dynamic(dynamic_axes, names_in, inputs)
        variants = []
        for d in dims:
            grown = list(inputs)
            grown[d.input_index] = _grown(inputs[d.input_index], d.axis)
            variants.append(_capture(model_or_fn, grown))
    finally:
        if module is not None:
            if restore_dtype is not None:
                module.to(dtype=restore_dtype)
            module.train(was_training)
    syms = solve(graph.records, [v.records for v in variants], dims)
    b = Builder(opset, dims, syms, names_in)
    b.device = graph.device
    b.shapes = dict(graph.shapes)
    b.dtypes = dict(graph.dtypes)
    onnx_inputs = []
    for name, gv in zip(names_in, graph.inputs):
        b.names[gv.id] = name
        shape: list[Any] = list(gv.spec.shape)
        for d in dims:
            if names_in[d.input_index] == name:
                shape[d.axis] = d.symbol
        onnx_inputs.append(value_info(name, gv.spec.dtype, shape))
    for gv in graph.constants:
        b.names[gv.id] = b.const(gv.tensor.detach().numpy(), name=_unique_name(b, gv.name))
    for i, rec in enumerate(graph.records):
        b.record_index = i
        _lower_record(b, rec, dynamic=bool(dims))
    names_out = list(output_names) if output_names is not None else (
        ["output"] if len(graph.outputs) == 1 else [f"output{i}" for i in range(len(graph.outputs))])
    if len(names_out) != len(graph.outputs):
        raise ember.errors.ShapeError(f"ember_onnx.export: {len(names_out)} output_names for "
                                      f"{len(graph.outputs)} outputs")
    outputs = []
    for name, vid, spec in zip(names_out, graph.outputs, graph.output_specs):
        src = b.names[vid]
        b.nodes.append(helper.make_node("Identity", [src], [name], name=b.fresh("n_output")))
        shape = _output_shape(len(outputs), spec, variants, dims)
        outputs.append(value_info(name, spec.dtype, shape))
    nodes, initializers = _live(b.nodes, b.initializers, names_out)
    model = helper.make_model(
        helper.make_graph(nodes, "ember", onnx_inputs, outputs, initializer=initializers),
        opset_imports=[helper.make_opsetid("", opset)], producer_name="ember-onnx",
        producer_version=_version())
    model.ir_version = min(model.ir_version, 10)  # readable by onnxruntime releases of the last two years
    big = model.ByteSize() > _TWO_GB if _small_enough(b) else True
    if big:
        if path is None:
            raise ExportError("ember_onnx.export: the model is over 2 GB; give a path (its weights go to an "
                              "external data file next to it)")
        onnx.save_model(model, os.fspath(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(os.fspath(path)) + ".data")
        onnx.checker.check_model(os.fspath(path), full_check=True)
        return model
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save_model(model, os.fspath(path))
    return model


def _live(nodes: list[Any], inits: list[Any], outputs: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """Drop nodes no output depends on (values only read during capture, such as embedding's range check)."""
    needed = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    return keep[::-1], [i for i in inits if i.name in needed]


def _small_enough(b: Builder) -> bool:
    return sum(len(t.raw_data) for t in b.initializers) < _TWO_GB - 2**26


def _output_shape(i: int, spec: Any, variants: Sequence[Any], dims: Sequence[DimRef]) -> list[int | str | None]:
    """Output ``i``'s dims: static, a dynamic input's symbol when it follows that axis alone, else unnamed."""
    shape: list[int | str | None] = list(spec.shape)
    for k, size in enumerate(spec.shape):
        moved = [j for j, v in enumerate(variants) if v.output_specs[i].shape[k] != size]
        if not moved:
            continue
        j = moved[0]
        follows = len(moved) == 1 and size == dims[j].size and variants[j].output_specs[i].shape[k] == size + 1
        shape[k] = dims[j].symbol if follows else None
    return shape


def _unique_name(b: Builder, name: str) -> str:
    taken = {i.name for i in b.initializers}
    out = name
    while out in taken or out in b.input_names:
        out = "_" + out
    return out


def _version() -> str:
    from .. import __version__

    return __version__
