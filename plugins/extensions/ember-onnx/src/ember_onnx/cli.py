"""``ember onnx export`` and ``ember onnx check``: core's ``ember`` command gets them through the ``ember.commands``
entry point (:func:`register`); ``python -m ember_onnx.cli`` runs the same parser standalone.

``ember onnx export --model seed-cnn --weights cnn.pt --shape 1,1,28,28 --dynamic-batch -o cnn.onnx`` exports a
model built by a factory (``seed-cnn``, ``seed-transformer``, ``seed-transformer-full`` or ``package.module:callable``)
with a saved ``state_dict`` (``ember.save(model.state_dict(), path)``). ``ember onnx check model.onnx`` imports an
ONNX file (listing every unsupported op), runs it on random inputs on an ember device and, when onnxruntime is
installed, compares with it; ``ember onnx check --node-tests`` scores ONNX's node tests instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ember

_BUILTIN = {
    "seed-cnn": ("ember_train.models", "seed_cnn", {}),
    "seed-transformer": ("ember_train.models", "text_transformer", {"config": "small"}),
    "seed-transformer-full": ("ember_train.models", "text_transformer", {"config": "full"}),
}


def _factory(spec: str) -> Callable[[], ember.nn.Module]:
    if spec in _BUILTIN:
        mod, name, kwargs = _BUILTIN[spec]
        fn = getattr(importlib.import_module(mod), name)
        return lambda: fn(**kwargs)
    if ":" not in spec:
        raise ember.errors.ValueRangeError(f"ember onnx export: --model {spec!r} is neither one of "
                                           f"{sorted(_BUILTIN)} nor package.module:callable")
    mod, name = spec.split(":", 1)
    return getattr(importlib.import_module(mod), name)


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: expected comma-separated ints such as 1,1,28,28") \
            from None


def run_export(args: argparse.Namespace) -> int:
    """``ember onnx export``."""
    from .exporter import export

    model = _factory(args.model)()
    if args.weights:
        model.load_state_dict(ember.load(args.weights))
    dtype = ember.dtypes.as_dtype(args.input_dtype)
    if dtype.is_floating_point:
        x = ember.randn(*args.shape, dtype=dtype)
    else:
        x = ember.zeros(*args.shape, dtype=dtype)
    dynamic = {"input": {0: "batch"}} if args.dynamic_batch else None
    proto = export(model, x, args.output, opset=args.opset, dynamic_axes=dynamic)
    print(f"ember onnx export: {args.model} -> {args.output} (opset {args.opset}, {len(proto.graph.node)} nodes, "
          f"{len(proto.graph.initializer)} initializers)")
    return 0


def _example(vi: Any) -> np.ndarray:
    from onnx import helper

    t = vi.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else 1 for d in t.shape.dim]
    dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
    rng = np.random.default_rng(0)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    return np.zeros(shape, dtype=dt)


def run_check(args: argparse.Namespace) -> int:
    """``ember onnx check``."""
    if args.node_tests:
        from .scorer import main as score_main

        return score_main([f"--device={d}" for d in (args.device or ["flex"])])
    if not args.model:
        print("ember onnx check: give an ONNX file or --node-tests", file=sys.stderr)
        return 2
    from .importer.graph import as_model, load, unsupported_ops

    proto = as_model(args.model)
    missing = unsupported_ops(proto)
    if missing:
        print(f"ember onnx check: {len(missing)} unsupported op(s): {', '.join(missing)}")
        return 1
    inits = {i.name for i in proto.graph.initializer}
    feeds = {vi.name: _example(vi) for vi in proto.graph.input if vi.name not in inits}
    status = 0
    for dev in args.device or ["flex"]:
        module = load(proto, device=dev)
        outs = module(**feeds)
        outs = outs if isinstance(outs, tuple) else (outs,)
        line = f"{dev}: ran, outputs " + ", ".join(f"{n} {tuple(o.shape)}" for n, o in
                                                   zip(module.output_names, outs))
        try:
            import onnxruntime as ort
        except ImportError:
            print(line + " (onnxruntime not installed: no comparison)")
            continue
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
        worst = max(float(np.max(np.abs(o.detach().numpy().astype(np.float64) - r))) if r.size else 0.0
                    for o, r in zip(outs, ref))
        ok = all(np.allclose(o.detach().numpy(), r, rtol=args.rtol, atol=args.atol) for o, r in zip(outs, ref))
        print(f"{line}; max |ember - onnxruntime| = {worst:.3g} ({'ok' if ok else 'MISMATCH'})")
        status = status or (0 if ok else 1)
    return status


def _add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="onnx_command", metavar="{export,check}", required=True)
    e = sub.add_parser("export", help="export a model (factory + saved state_dict) to ONNX")
    e.add_argument("--model", required=True, help=f"{', '.join(sorted(_BUILTIN))} or package.module:callable")
    e.add_argument("--weights", help="a state_dict saved with ember.save (default: the factory's initialisation)")
    e.add_argument("--shape", type=_shape, required=True, help="example input shape, e.g. 1,1,28,28")
    e.add_argument("--input-dtype", default="float32", help="example input dtype (int64 for token ids)")
    e.add_argument("--opset", type=int, default=18)
    e.add_argument("--dynamic-batch", action="store_true", help="make axis 0 of the input symbolic")
    e.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    e.set_defaults(func=run_export)
    c = sub.add_parser("check", help="import an ONNX file and run it (vs onnxruntime), or score the node tests")
    c.add_argument("model", nargs="?", help="an .onnx file")
    c.add_argument("--device", action="append", help="ember device (repeatable; default flex)")
    c.add_argument("--node-tests", action="store_true", help="score ONNX's backend node tests instead")
    c.add_argument("--rtol", type=float, default=1e-4)
    c.add_argument("--atol", type=float, default=1e-5)
    c.set_defaults(func=run_check)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``onnx`` to core's ``ember`` subcommands (the ``ember.commands`` entry point)."""
    p = subparsers.add_parser("onnx", help="export models to ONNX, check ONNX models on ember devices",
                              description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ember_onnx.cli``: the same commands without core's ``ember`` entry point."""
    p = argparse.ArgumentParser(prog="ember onnx")
    _add_arguments(p)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
