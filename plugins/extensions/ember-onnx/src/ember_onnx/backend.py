"""``onnx.backend.base.Backend`` on ember, so ONNX's own backend test runner can drive ember-onnx.

>>> from ember_onnx.backend import EmberBackend  # doctest: +SKIP
>>> rep = EmberBackend.prepare(model, device="CPU", ember_device="flex+autodiff")  # doctest: +SKIP
>>> outputs = rep.run([x])  # doctest: +SKIP

ONNX device strings name hardware (``"CPU"``, ``"CUDA"``); the ember device that runs the graph is
``ember_device`` (default: ember's default device), so one runner scores any ember device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto
from onnx.backend.base import Backend, BackendRep, namedtupledict

import ember
from ember import Tensor

from .importer.graph import OnnxModule, load


def _to_numpy(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().numpy()
    if isinstance(value, list):
        return [_to_numpy(v) for v in value]
    return value


class EmberRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the outputs as numpy arrays, in graph order."""

    def __init__(self, module: OnnxModule) -> None:
        self.module = module

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run the model on ``inputs`` (a list in graph-input order, a dict by name, or one array)."""
        if isinstance(inputs, dict):
            outs = self.module(**inputs)
        elif isinstance(inputs, (list, tuple)):
            outs = self.module(*inputs)
        else:
            outs = self.module(inputs)
        if not isinstance(outs, tuple):
            outs = (outs,)
        return namedtupledict("Outputs", self.module.output_names)(*[_to_numpy(o) for o in outs])


class EmberBackend(Backend):
    """ONNX backend API over :func:`ember_onnx.load`."""

    @classmethod
    def prepare(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> EmberRep:
        """Import ``model`` (typed error listing unsupported ops) onto ``kwargs['ember_device']``."""
        super().prepare(model, device, **kwargs)
        return EmberRep(load(model, device=kwargs.get("ember_device")))

    @classmethod
    def run_model(cls, model: ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        """Prepare and run in one call."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: NodeProto, inputs: Any, device: str = "CPU", outputs_info: Sequence[Any] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run a single node (wrapped into a one-node model by ONNX's helper)."""
        from onnx import helper

        from .dtypes import EMBER_TO_ONNX

        vals = [np.asarray(v) for v in inputs]
        graph_inputs = [helper.make_tensor_value_info(name, EMBER_TO_ONNX[ember.from_numpy(v).dtype], v.shape)
                        for name, v in zip(node.input, vals)]
        graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
        model = helper.make_model(helper.make_graph([node], "node", graph_inputs, graph_outputs))
        # the outputs' types are unknown here, so the checker in Backend.prepare would reject the wrapper
        return EmberRep(load(model, device=kwargs.get("ember_device"))).run(vals)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """ONNX device strings ember can serve: ``CPU`` always (the flex backend)."""
        return device.upper().startswith("CPU")


prepare = EmberBackend.prepare
run_model = EmberBackend.run_model
run_node = EmberBackend.run_node
supports_device = EmberBackend.supports_device
