"""Running an ONNX graph with ember ops: the executor, ONNX functions, the load-time op check, and the Module.

Ops come from the handler table (:mod:`.registry`); an op without a handler whose ONNX schema defines it as a
function (``Celu``, ``LayerNormalization``, ``Attention``, ...) runs that function body node by node, and a model's
own local functions run the same way. The support check walks the whole model (subgraphs and function bodies
included) at load time, so an unsupported model fails before its first call, naming every op it lacks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, helper, numpy_helper

import ember
from ember import Tensor, nn

from ..dtypes import to_ember_dtype, to_onnx_dtype
from ..errors import UnsupportedOnnxOpError
from .registry import OPS, Node, decode_attribute, normalize_domain

Opsets = Mapping[str, int]
Key = tuple[str, str]


def _schema(op_type: str, opset: int, domain: str) -> Any:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _best_version(versions: Iterable[int], opset: int) -> int | None:
    fit = [v for v in versions if v <= opset]
    return max(fit) if fit else None


def _schema_function(op_type: str, opset: int, domain: str) -> FunctionProto | None:
    """The context-free function body ONNX defines for this op at this opset, if any."""
    schema = _schema(op_type, opset, domain)
    if schema is None or not schema.has_function:
        return None
    version = _best_version(schema.function_opset_versions, opset)
    fn = FunctionProto()
    if version is None:
        fn.CopyFrom(schema.function_body)
    else:
        fn.ParseFromString(schema.get_function_with_opset_version(version))
    return fn


def _schema_defaults(op_type: str, opset: int, domain: str) -> dict[str, Any]:
    schema = _schema(op_type, opset, domain)
    out: dict[str, Any] = {}
    if schema is None:
        return out
    for name, attr in schema.attributes.items():
        if attr.default_value is not None and attr.default_value.type != AttributeProto.UNDEFINED:
            out[name] = decode_attribute(attr.default_value)
    return out


def _subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def unsupported_ops(model: ModelProto) -> list[str]:
    """Every op of ``model`` (subgraphs and function bodies included) that ember-onnx cannot run."""
    opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
    local = {(normalize_domain(f.domain), f.name): f for f in model.functions}
    missing: set[str] = set()
    seen: set[tuple[str, str, int]] = set()

    def walk(nodes: Iterable[NodeProto], opsets: Opsets) -> None:
        for node in nodes:
            domain = normalize_domain(node.domain)
            key = (domain, node.op_type)
            opset = opsets.get(domain, 1)
            for g in _subgraphs(node):
                walk(g.node, opsets)
            if (domain, node.op_type, opset) in seen:
                continue
            seen.add((domain, node.op_type, opset))
            if key in OPS:
                continue
            if key in local:
                fn = local[key]
                walk(fn.node, {**opsets, **{normalize_domain(o.domain): o.version for o in fn.opset_import}})
                continue
            body = _schema_function(node.op_type, opset, domain)
            if body is not None:
                walk(body.node, {**opsets, **{normalize_domain(o.domain): o.version for o in body.opset_import}})
                continue
            schema = _schema(node.op_type, opset, domain)
            if schema is not None and schema.has_context_dependent_function:
                continue  # its body depends on input types; checked when it runs
            missing.add(f"{domain or 'ai.onnx'}::{node.op_type}")

    walk(model.graph.node, opsets)
    return sorted(missing)


class Executor:
    """Runs graphs and function bodies of one model; ``constants`` caches Constant outputs per device."""

    def __init__(self, model: ModelProto, device: ember.Device) -> None:
        self.opsets: dict[str, int] = {normalize_domain(o.domain): o.version for o in model.opset_import}
        self.functions = {(normalize_domain(f.domain), f.name): f for f in model.functions}
        self._default_device = device
        # the device of the running call, per thread: one imported module may run from several threads at once
        self._local = threading.local()
        self._ctx_functions: dict[Any, FunctionProto] = {}

    @property
    def device(self) -> ember.Device:
        """Where constants of the running call are made (its inputs' device; the load device by default)."""
        return getattr(self._local, "device", None) or self._default_device

    @device.setter
    def device(self, value: ember.Device | None) -> None:
        self._local.device = value

    # -- graphs -----------------------------------------------------------------------------------------------
    def run_graph(self, graph: GraphProto, feeds: Mapping[str, Any], outer: Mapping[str, Any],
                  opsets: Opsets | None = None) -> list[Any]:
        """Run ``graph`` with ``feeds`` bound to its inputs; names of the enclosing scope come from ``outer``."""
        env: dict[str, Any] = dict(outer)
        for init in graph.initializer:
            if init.name not in feeds:
                env[init.name] = tensor_from_proto(init, self.device)
        env.update(feeds)
        self.run_nodes(graph.node, env, opsets or self.opsets)
        return [env[o.name] for o in graph.output]

    def run_nodes(self, nodes: Sequence[NodeProto], env: dict[str, Any], opsets: Opsets,
                  attr_scope: Mapping[str, Any] | None = None) -> None:
        for node in nodes:
            attrs: dict[str, Any] = {}
            for a in node.attribute:
                if a.ref_attr_name:
                    # a function body's attribute that refers to the caller's; absent when the caller omits it
                    if attr_scope is not None and a.ref_attr_name in attr_scope:
                        attrs[a.name] = attr_scope[a.ref_attr_name]
                else:
                    attrs[a.name] = decode_attribute(a)
            inputs = [env[n] if n else None for n in node.input]
            outputs = self.call(node, inputs, attrs, opsets, env)
            for name, value in zip(node.output, outputs):
                if name:
                    env[name] = value

    # -- one node ---------------------------------------------------------------------------------------------
    def call(self, node: NodeProto, inputs: list[Any], attrs: dict[str, Any], opsets: Opsets,
             env: Mapping[str, Any]) -> list[Any]:
        """Run one node (handler, local function or ONNX function body) and return its outputs in order."""
        domain = normalize_domain(node.domain)
        key = (domain, node.op_type)
        opset = opsets.get(domain, 1)
        device = next((t.device for t in inputs if isinstance(t, Tensor)), self.device)
        handler = OPS.get(key)
        if handler is not None:

            def sub(graph: GraphProto, feeds: Mapping[str, Any]) -> list[Any]:
                return self.run_graph(graph, feeds, env, opsets)

            result = handler(Node(node, opset, device, sub, attrs), *inputs)
            # a tuple is several outputs; anything else (a tensor, a list = an ONNX sequence) is one
            if not isinstance(result, tuple):
                result = [result]
            return list(result)
        fn = self.functions.get(key)
        if fn is not None:
            defaults = {a.name: decode_attribute(a) for a in fn.attribute_proto}
            return self.run_function(fn, inputs, {**defaults, **attrs}, opsets)
        body = _schema_function(node.op_type, opset, domain)
        if body is None:
            body = self._context_function(node, inputs, attrs, opset, domain)
        return self.run_function(body, inputs, {**_schema_defaults(node.op_type, opset, domain), **attrs}, opsets)

    def run_function(self, fn: FunctionProto, inputs: list[Any], attrs: Mapping[str, Any],
                     opsets: Opsets) -> list[Any]:
        """Run a FunctionProto's body with ``inputs`` bound positionally and ``attrs`` for its attribute refs."""
        env: dict[str, Any] = {}
        for name, value in zip(fn.input, inputs):
            if name:
                env[name] = value
        inner = {**opsets, **{normalize_domain(o.domain): o.version for o in fn.opset_import}}
        self.run_nodes(fn.node, env, inner, attr_scope=attrs)
        return [env.get(o) for o in fn.output]

    def _context_function(self, node: NodeProto, inputs: list[Any], attrs: Mapping[str, Any], opset: int,
                          domain: str) -> FunctionProto:
        schema = _schema(node.op_type, opset, domain)
        if schema is None or not schema.has_context_dependent_function:
            raise UnsupportedOnnxOpError([f"{domain or 'ai.onnx'}::{node.op_type}"], "ember_onnx run")
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        # ONNX builds the body from the input types; only plain tensors are safe to describe to it
        if not all(t is None or isinstance(t, Tensor) for t in inputs):
            raise UnsupportedOnnxOpError([f"{domain or 'ai.onnx'}::{node.op_type} (non-tensor inputs)"],
                                         "ember_onnx run")
        # an absent optional input in the middle keeps its empty name and an empty type
        types = [helper.make_tensor_type_proto(to_onnx_dtype(t.dtype), list(t.shape)) if t is not None
                 else onnx.TypeProto() for t in inputs]
        # the body sees the node with its attributes resolved (a function body's refs already substituted)
        names = [n if t is not None else "" for n, t in zip(node.input, inputs)]
        resolved = helper.make_node(node.op_type, names, list(node.output), domain=node.domain)
        for name, value in attrs.items():
            resolved.attribute.append(_make_attribute(name, value))
        key = (resolved.SerializeToString(), tuple(t.SerializeToString() for t in types), opset)
        fn = self._ctx_functions.get(key)
        if fn is None:
            version = _best_version(schema.context_dependent_function_opset_versions, opset)
            raw = (schema.get_context_dependent_function_with_opset_version(
                version, resolved.SerializeToString(), [t.SerializeToString() for t in types])
                if version is not None else
                schema.get_context_dependent_function(resolved.SerializeToString(),
                                                      [t.SerializeToString() for t in types]))
            fn = FunctionProto()
            fn.ParseFromString(raw)
            self._ctx_functions[key] = fn
        return fn


def _make_attribute(name: str, value: Any) -> AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    return helper.make_attribute(name, value)


def tensor_from_proto(proto: onnx.TensorProto, device: ember.Device) -> Tensor:
    """An ONNX TensorProto (initializer, Constant value) as an ember tensor on ``device``."""
    to_ember_dtype(proto.data_type, f"initializer {proto.name!r}")
    return ember.tensor(np.array(numpy_helper.to_array(proto), order="C"), device=device)


def to_tensor(value: Any, device: ember.Device) -> Any:
    """A user input (numpy array, Python number, ember tensor, list for a sequence, None) as ember values."""
    if value is None or isinstance(value, Tensor):
        return value
    if isinstance(value, list):
        return [to_tensor(v, device) for v in value]
    arr = np.asarray(value)
    if arr.dtype.kind in "USO":
        raise to_ember_dtype_error(arr)
    return ember.tensor(np.array(arr, order="C"), device=device)


def to_ember_dtype_error(arr: np.ndarray) -> Exception:
    from ..errors import OnnxDTypeError

    return OnnxDTypeError(f"ember_onnx: input of numpy dtype {arr.dtype} has no ember dtype")


class _Namespace(nn.Module):
    """A container that gives initializers dotted names (``fc.weight``) in ``state_dict``."""

    def forward(self, *args: Any) -> Any:  # pragma: no cover - containers are never called
        raise TypeError("an ONNX initializer namespace is not callable")


class OnnxModule(nn.Module):
    """An imported ONNX model as an ``ember.nn.Module``.

    ``forward(*inputs)`` takes the graph's inputs (ember tensors, numpy arrays or numbers) positionally or by
    ONNX name and returns the single output, or a tuple when the graph has several. Floating-point initializers
    are Parameters (trainable), the others buffers, reachable under their ONNX names (``named_parameters``).
    """

    def __init__(self, model: ModelProto, device: ember.Device) -> None:
        super().__init__()
        self.model = model
        self._executor = Executor(model, device)
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self._slots: dict[str, tuple[nn.Module, str]] = {}
        for init in model.graph.initializer:
            t = tensor_from_proto(init, device)
            owner, attr = self._slot(init.name)
            if t.dtype.is_floating_point:
                owner.register_parameter(attr, nn.Parameter(t))
            else:
                owner.register_buffer(attr, t)
            self._slots[init.name] = (owner, attr)

    def _slot(self, name: str) -> tuple[nn.Module, str]:
        parts = name.split(".")
        if all(parts) and len(parts) > 1:
            owner: nn.Module = self
            ok = True
            for p in parts[:-1]:
                child = owner._modules.get(p)
                if child is None:
                    if p in owner.__dict__ or p in owner._parameters or p in owner._buffers or hasattr(owner, p):
                        ok = False
                        break
                    child = _Namespace()
                    owner.add_module(p, child)
                owner = child
            if ok and parts[-1] not in owner._modules and not hasattr(type(owner), parts[-1]):
                return owner, parts[-1]
        flat = name.replace(".", "_") or "_"
        while flat in self._modules or flat in self._parameters or flat in self._buffers or hasattr(type(self), flat):
            flat = "_" + flat
        return self, flat

    def initializer(self, name: str) -> Tensor:
        """The current value of initializer ``name`` (its Parameter or buffer)."""
        owner, attr = self._slots[name]
        return getattr(owner, attr)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self.input_names):
            raise ember.errors.ShapeError(f"OnnxModule: the model takes {len(self.input_names)} inputs "
                                          f"({self.input_names}), got {len(args)}")
        bound = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise ember.errors.ValueRangeError(f"OnnxModule: unknown input {k!r} (inputs: {self.input_names})")
            bound[k] = v
        device = next((v.device for v in bound.values() if isinstance(v, Tensor)), None)
        if device is None:
            device = next((p.device for p in self.parameters()), self._executor._default_device)
        feeds = {k: to_tensor(v, device) for k, v in bound.items()}
        # graph inputs with initializers are defaults the caller may override (ONNX IR < 4 lists them as inputs)
        values = {name: self.initializer(name) for name in self._slots if name not in feeds}
        self._executor.device = device
        try:
            outs = self._executor.run_graph(self.model.graph, {**values, **feeds}, {})
        finally:
            self._executor.device = None
        return outs[0] if len(outs) == 1 else tuple(outs)


def as_model(model: str | bytes | ModelProto | Any) -> ModelProto:
    """A ModelProto from a path, serialized bytes, a file object or a ModelProto."""
    if isinstance(model, ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    return onnx.load(model)


def load(model: str | bytes | ModelProto | Any, device: ember.Device | str | None = None,
         check: Callable[[ModelProto], list[str]] = unsupported_ops) -> OnnxModule:
    """Import an ONNX model (path, bytes, file object or ``onnx.ModelProto``) as an :class:`OnnxModule`.

    Initializers are created on ``device`` (default: ember's default device). Raises
    :class:`~ember_onnx.errors.UnsupportedOnnxOpError` listing every op the model uses that ember-onnx lacks.
    """
    proto = as_model(model)
    missing = check(proto)
    if missing:
        raise UnsupportedOnnxOpError(missing)
    if device is None:
        dev = ember.default_device()
    elif isinstance(device, str):
        dev = ember.Device.parse(device)
    else:
        dev = device
    return OnnxModule(proto, dev)
