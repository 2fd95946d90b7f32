"""Score ember-onnx on ONNX's backend node tests (``onnx.backend.test.loader.load_model_tests(kind="node")``).

``python -m ember_onnx.scorer --device flex [--device flex+autodiff] [--json out.json]`` prints the pass count per
device and the failures per category. The cases and their data ship inside the ``onnx`` package (no download);
outputs are compared as ONNX's runner does (same dtype, ``assert_allclose`` with the case's rtol/atol).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import ember
from ember.errors import DTypeError, ShapeError, ValueRangeError

from .errors import OnnxAttributeError, OnnxDTypeError, UnsupportedOnnxOpError
from .importer.graph import load

#: failure categories, in the order reports list them
CATEGORIES = ("unsupported op", "dtype", "attribute", "numeric mismatch", "shape mismatch", "sequence/optional",
              "error")


@dataclass
class CaseResult:
    """One node test's outcome on one device."""

    name: str
    passed: bool
    category: str = ""
    detail: str = ""
    seconds: float = 0.0


def node_cases(names: Iterable[str] | None = None) -> list[Any]:
    """ONNX's node test cases (all, or those named), generated in memory by the onnx package."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    if names is not None:
        wanted = set(names)
        cases = [c for c in cases if c.name in wanted]
    return cases


def _normalize(value: Any) -> Any:
    """A case's value as numpy (TensorProto and numpy scalars converted; lists stay sequences)."""
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


def _is_plain(value: Any) -> bool:
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    return value is None or (isinstance(value, np.ndarray) and value.dtype.kind not in "OUS")


def _compare(expected: Any, got: Any, rtol: float, atol: float) -> None:
    if expected is None:
        if got is not None:
            raise AssertionError(f"expected an empty optional, got {type(got).__name__}")
        return
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            raise AssertionError(f"expected a sequence of {len(expected)}, got {type(got).__name__}")
        for e, g in zip(expected, got):
            _compare(e, g, rtol, atol)
        return
    got = np.asarray(got)
    if got.dtype != expected.dtype:
        raise DTypeError(f"output dtype {got.dtype}, expected {expected.dtype}")
    if got.shape != expected.shape:
        raise ShapeError(f"output shape {got.shape}, expected {expected.shape}")
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def _host(value: Any) -> Any:
    if isinstance(value, ember.Tensor):
        return value.detach().numpy()
    if isinstance(value, list):
        return [_host(v) for v in value]
    return value


def categorize(exc: BaseException) -> str:
    """The failure category of an exception raised while importing or running a case."""
    if isinstance(exc, UnsupportedOnnxOpError):
        return "unsupported op"
    if isinstance(exc, (OnnxDTypeError, DTypeError)):
        return "dtype"
    if isinstance(exc, (OnnxAttributeError, ValueRangeError)):
        return "attribute"
    if isinstance(exc, ShapeError):
        return "shape mismatch"
    if isinstance(exc, AssertionError):
        return "numeric mismatch"
    return "error"


def run_case(case: Any, device: ember.Device) -> CaseResult:
    """Import and run one case on ``device``; compare every data set."""
    start = time.perf_counter()
    try:
        data = [([_normalize(v) for v in i], [_normalize(v) for v in o]) for i, o in case.data_sets]
        for inputs, outputs in data:
            if not all(_is_plain(v) for v in list(inputs) + list(outputs)):
                return CaseResult(case.name, False, "sequence/optional", "sequence, optional or string values",
                                  time.perf_counter() - start)
        module = load(case.model, device=device)
        for inputs, outputs in data:
            got = module(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            if len(got) < len(outputs):
                raise ShapeError(f"{len(got)} outputs, expected {len(outputs)}")
            for e, g in zip(outputs, got):
                _compare(e, _host(g), case.rtol, case.atol)
    except Exception as exc:  # noqa: BLE001 - every failure is scored, not raised
        return CaseResult(case.name, False, categorize(exc), f"{type(exc).__name__}: {str(exc)[:300]}",
                          time.perf_counter() - start)
    return CaseResult(case.name, True, "", "", time.perf_counter() - start)


def score(device: ember.Device | str, cases: Sequence[Any] | None = None,
          skip: Iterable[str] = ()) -> list[CaseResult]:
    """Run the node tests (``cases`` or all) on ``device``, skipping the names in ``skip``."""
    dev = ember.Device.parse(device) if isinstance(device, str) else device
    skipped = set(skip)
    cases = node_cases() if cases is None else cases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [run_case(c, dev) for c in cases if c.name not in skipped]


def summary(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Pass count, total and failures per category."""
    cats = Counter(r.category for r in results if not r.passed)
    return {"passed": sum(r.passed for r in results), "total": len(results),
            "failures": {c: cats.get(c, 0) for c in CATEGORIES}}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: score one or more devices and print (and optionally save) the figures."""
    parser = argparse.ArgumentParser(prog="python -m ember_onnx.scorer", description=__doc__.split("\n")[0])
    parser.add_argument("--device", action="append", help="ember device (repeatable); default flex")
    parser.add_argument("--json", help="write every case's result here")
    parser.add_argument("--only", nargs="*", help="case names to run")
    args = parser.parse_args(argv)
    cases = node_cases(args.only)
    report: dict[str, Any] = {}
    for dev in args.device or ["flex"]:
        t0 = time.perf_counter()
        results = score(dev, cases)
        s = summary(results)
        print(f"{dev}: {s['passed']}/{s['total']} passed in {time.perf_counter() - t0:.1f}s; failures: "
              + ", ".join(f"{k} {v}" for k, v in s["failures"].items()))
        report[dev] = {"summary": s, "cases": [asdict(r) for r in results]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
