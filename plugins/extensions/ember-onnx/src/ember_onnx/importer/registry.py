"""The import op table: ONNX ``(domain, op_type)`` -> a function of ember ops, and the per-node context it gets.

A handler is ``fn(node: Node, *inputs) -> Tensor | tuple[Tensor | None, ...]``; missing optional inputs arrive as
``None``; sequences (``seq(tensor)``) arrive as Python lists. Handlers only call ember ops, so an imported model runs
on whatever device its inputs live on (flex, OpenCL, with autodiff recording gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto, NodeProto, helper, numpy_helper

import ember
from ember import Tensor

from ..errors import OnnxAttributeError

Handler = Callable[..., Any]

#: (domain, op_type) -> handler; "" is the default ONNX domain
OPS: dict[tuple[str, str], Handler] = {}
#: (domain, op_type) -> the module area that implements it (docs table)
AREAS: dict[tuple[str, str], str] = {}


def register(*op_types: str, domain: str = "", area: str = "") -> Callable[[Handler], Handler]:
    """Register ``fn`` as the importer of each of ``op_types`` in ``domain``."""

    def deco(fn: Handler) -> Handler:
        for op in op_types:
            OPS[(domain, op)] = fn
            AREAS[(domain, op)] = area or fn.__module__.rsplit(".", 1)[-1].removeprefix("ops_")
        return fn

    return deco


def normalize_domain(domain: str) -> str:
    """ONNX spells the default domain both ``""`` and ``"ai.onnx"``."""
    return "" if domain in ("", "ai.onnx") else domain


def decode_attribute(attr: AttributeProto) -> Any:
    """An attribute's Python value: tensors become numpy arrays, graphs stay GraphProtos."""
    if attr.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if attr.type == AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in attr.tensors]
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if attr.type == AttributeProto.STRINGS:
        return [v.decode("utf-8") for v in value]
    return value


@dataclass
class Node:
    """What a handler sees of its node: attributes, opset, output count, the device, and a subgraph runner."""

    proto: NodeProto
    opset: int
    device: ember.Device
    run_subgraph: Callable[..., list[Any]]
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def op_type(self) -> str:
        """The node's op type (``Conv``)."""
        return self.proto.op_type

    @property
    def num_outputs(self) -> int:
        """How many outputs the node declares (trailing optional ones included)."""
        return len(self.proto.output)

    def wants(self, i: int) -> bool:
        """Whether output ``i`` is used (declared with a non-empty name)."""
        return i < len(self.proto.output) and bool(self.proto.output[i])

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute ``name``, or ``default`` when the node does not set it."""
        return self.attrs.get(name, default)

    def fail(self, message: str) -> OnnxAttributeError:
        """A typed error naming this node's op and name."""
        label = f"{self.op_type}" + (f" ({self.proto.name!r})" if self.proto.name else "")
        return OnnxAttributeError(f"ONNX {label}: {message}")

    def const(self, value: Any, dtype: ember.DType | None = None, like: Tensor | None = None) -> Tensor:
        """A constant tensor on the node's device (``like``'s device and dtype when given)."""
        device = like.device if like is not None else self.device
        dtype = dtype if dtype is not None else (like.dtype if like is not None else None)
        if isinstance(value, np.ndarray) and dtype is None:
            return ember.tensor(value, device=device)
        return ember.tensor(value, dtype=dtype, device=device)


def host_ints(t: Tensor | None) -> list[int] | None:
    """A small integer tensor (shape, axes, pads, ...) read back to Python ints, flattened."""
    if t is None:
        return None
    return [int(v) for v in np.asarray(t.detach().numpy()).reshape(-1).tolist()]


def host_floats(t: Tensor | None) -> list[float] | None:
    """A small float tensor (scales, ...) read back to Python floats, flattened."""
    if t is None:
        return None
    return [float(v) for v in np.asarray(t.detach().numpy()).reshape(-1).tolist()]


def host_scalar(t: Tensor | None) -> Any:
    """A one-element tensor's Python value (``None`` stays ``None``)."""
    if t is None:
        return None
    return np.asarray(t.detach().numpy()).reshape(-1)[0].item()


def norm_axis(axis: int, rank: int) -> int:
    """A possibly negative ONNX axis as a non-negative dim."""
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    """Possibly negative ONNX axes as non-negative dims."""
    return [norm_axis(a, rank) for a in axes]
