"""Fuzz every public op against torch 2.13 on every device (see README.md in this folder).

``test_op_matches_torch[<device>-<op>]`` draws ``EMBER_FUZZ_EXAMPLES`` cases (default 3; ``nox -s fuzz`` runs 2000)
of one op from the table in ``fuzz_ops.py``, valid and invalid, runs each in torch and on the device, and fails on
any ``raw`` (a non-ember exception), ``wrong`` (results differ, or one side raises) or ``hang`` outcome, listing every
failing case with its arguments, except the open classes listed in ``known_failures.py``, which
``test_known_fuzz_failures_still_open[<device>]`` reports instead. Hypothesis runs with a fixed seed per op and no
database: a run is reproducible.
"""

from __future__ import annotations

import functools

import pytest

hypothesis = pytest.importorskip("hypothesis")

import fuzz_engine as fe  # noqa: E402 - after the importorskip
import fuzz_ops as fo  # noqa: E402
from known_failures import KNOWN  # noqa: E402

import ember  # noqa: E402


@pytest.fixture(params=fe.DEVICES)
def fuzz_device(request: pytest.FixtureRequest) -> str:
    reason = fe.unavailable(request.param)
    if reason:
        pytest.skip(reason)  # e.g. no OpenCL platform on this machine
    return request.param


@functools.cache
def failures(device: str, op_name: str) -> tuple[int, tuple[fe.Outcome, ...]]:
    """(cases run, failing outcomes) of one op on one device; computed once per session (the known-failures
    test below reuses what the per-op tests found). Only failures are kept: the long run draws millions."""
    outcomes = fo.run_op(fo.BY_NAME[op_name], device, fe.EXAMPLES)
    return len(outcomes), tuple(o for o in outcomes if o.failed)


@pytest.mark.parametrize("op", fo.OPS, ids=lambda o: o.name)
def test_op_matches_torch(fuzz_device: str, op: fo.Op) -> None:
    """No raw error, wrong result or hang, except the failure classes listed in known_failures.KNOWN (those are
    reported by test_known_fuzz_failures_still_open instead)."""
    n, failed = failures(fuzz_device, op.name)
    assert n, "no case was drawn"
    new = [o for o in failed if o.class_key not in KNOWN]
    assert not new, f"{len(new)} of {n} cases failed:\n" + "\n".join(f"{o.class_key}\n    {o.describe()}"
                                                                      for o in new)


def test_known_fuzz_failures_still_open(fuzz_device: str) -> None:
    """Fails while any failure class of known_failures.KNOWN still shows on this device: the open defects the
    fuzz suite found, one line per class with an example call. Delete a class from KNOWN once it is fixed."""
    seen: dict[str, list[fe.Outcome]] = {}
    for op in fo.OPS:
        for o in failures(fuzz_device, op.name)[1]:
            if o.class_key in KNOWN:
                seen.setdefault(o.class_key, []).append(o)
    assert not seen, f"{len(seen)} known failure classes still open on {fuzz_device}:\n" + "\n".join(
        f"- {key} ({len(v)} cases; {KNOWN[key]})\n    e.g. {v[0].describe()[:400]}" for key, v in sorted(seen.items()))


def test_table_covers_fifty_ops_and_the_families_the_issue_names() -> None:
    names = {o.name for o in fo.OPS}
    assert len(names) >= 50
    for required in ("add", "eq", "sum", "reshape", "view", "permute", "transpose", "squeeze", "unsqueeze",
                     "expand", "cat", "stack", "split", "chunk", "flatten", "__getitem__", "gather", "scatter",
                     "index_select", "where", "masked_fill", "zeros", "ones", "full", "arange", "linspace", "eye",
                     "tensor", "matmul", "bmm", "softmax", "log_softmax", "relu", "gelu", "conv2d", "max_pool2d",
                     "avg_pool2d", "pad", "cross_entropy", "mse_loss", "layer_norm", "batch_norm", "dropout",
                     "clamp", "cumsum", "sort", "topk", "argmax"):
        assert required in names, required


def test_table_covers_the_tensor_method_registry() -> None:
    """Every op module's ``TENSOR_METHODS`` name is exercised by the table or listed in ``fo.NOT_FUZZED`` with a
    reason (random ops, views of memory, in-place twins of fuzzed ops)."""
    missing = sorted(fo.uncovered_methods())
    assert not missing, f"Tensor methods neither fuzzed nor listed in fuzz_ops.NOT_FUZZED: {missing}"


def test_classifier_tells_typed_raw_and_wrong_apart() -> None:
    """The verdict itself: a typed error where torch raises is ok, a raw one or a different value fails."""

    def gen(g: fo.G) -> fe.Case:
        return fe.Case(())

    def raising(exc: BaseException) -> fo.Op:
        def call(ns: fe.NS, *a: object) -> object:
            if ns.is_torch:
                raise RuntimeError("torch refuses")
            raise exc

        return fo.Op("probe", gen, call)

    dev = "flex"
    assert fe.run_case(raising(ember.ShapeError("x")), fe.Case(()), dev)[0].kind == "typed"
    assert fe.run_case(raising(ValueError("x")), fe.Case(()), dev)[0].kind == "raw"
    value = fo.Op("probe", gen, lambda ns: ns.m.tensor([1.0, 2.0 if ns.is_torch else 2.5]))
    out = fe.run_case(value, fe.Case(()), dev)[0]
    assert out.kind == "wrong" and "values differ" in out.detail
    accepts = fo.Op("probe", gen, lambda ns: (_ for _ in ()).throw(TypeError("no")) if ns.is_torch else 1)
    assert fe.run_case(accepts, fe.Case(()), dev)[0].kind == "wrong"
    same = fo.Op("probe", gen, lambda ns: ns.m.ones(2, 3, dtype=ns.m.int64, **ns.kw).sum(0))
    assert fe.run_case(same, fe.Case(()), dev)[0].kind == "same"
    dtype = fo.Op("probe", gen, lambda ns: ns.m.ones(2, dtype=ns.m.int32 if ns.is_torch else ns.m.int64, **ns.kw))
    assert "dtype" in fe.run_case(dtype, fe.Case(()), dev)[0].detail


def test_a_hang_is_reported_not_waited_for() -> None:
    def spin(ns: fe.NS) -> object:
        if ns.is_torch:
            return 1
        while True:
            pass

    op = fo.Op("spin", lambda g: fe.Case(()), spin)
    saved = fe.SOFT_TIMEOUT
    try:
        fe.SOFT_TIMEOUT = 0.2
        out = fe.run_case(op, fe.Case(()), "flex")[0]
    finally:
        fe.SOFT_TIMEOUT = saved
    assert out.kind == "hang"
