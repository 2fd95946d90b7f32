"""The blocked path of flex's fused kernels (ember_flex.fusion_blocks): bit for bit the numpy path (ember.ir.interpret
on flex) on every layout it takes, the numpy path itself where it does not apply, on one thread and on two."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numexpr")

import ember  # noqa: E402
from ember import dtypes as dt  # noqa: E402
from ember.ir import Instr, Kernel, interpret  # noqa: E402
from ember_flex import fusion, fusion_blocks, threads  # noqa: E402
from ember_flex.backend import FlexBackend  # noqa: E402

f32, f64, i32, b = dt.float32, dt.float64, dt.int32, dt.bool_
N = fusion_blocks.BLOCKED_MIN * 2 + 123  # several blocks and a short last one


@pytest.fixture(scope="module")
def be() -> FlexBackend:
    s = ember.Device.flex().base.stack
    while not isinstance(s, FlexBackend):
        s = s.inner
    return s


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 4 Ki elements, 2 per task: the test arrays make many blocks, several tasks and a short last one."""
    monkeypatch.setattr(fusion_blocks, "BLOCK_ELEMS", 1 << 12)
    monkeypatch.setattr(fusion_blocks, "BLOCKS_PER_TASK", 2)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def nthreads(request):
    before = threads.get_num_threads()
    ember.set_num_threads(request.param)
    yield request.param
    ember.set_num_threads(before)


def L(k, d):
    return Instr("load", (k,), d)


def S(k, d):
    return Instr("scalar", (k,), d)


def U(name, a, d):
    return Instr("unary", (name, a), d)


def B(name, a, c, d):
    return Instr("binary", (name, a, c), d)


def same_bits(a, ref):
    a, ref = np.asarray(a), np.asarray(ref)
    assert a.dtype == ref.dtype and a.shape == ref.shape
    np.testing.assert_array_equal(a, ref)
    if a.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(a), np.signbit(ref))


def blocked(be, k, inputs, scalars, shape, outs=None):
    """The blocked path, asserting it ran (None from _try_blocked would mean it did not apply)."""
    fk = be.fusion_compile(k)
    r = fk._try_blocked(inputs, scalars, shape, outs)
    assert r is not None, "the blocked path did not take this call"
    return r


def gelu_kernel(d):
    body = (L(0, d), S(0, d), S(1, d), S(2, d), S(3, d),
            B("mul", 0, 0, d), B("mul", 5, 0, d), B("mul", 6, 3, d), B("add", 0, 7, d), B("mul", 8, 2, d),
            U("tanh", 9, d), B("add", 10, 4, d), B("mul", 0, 11, d), B("mul", 12, 1, d))
    return Kernel(1, (d,), 4, body, (13,))


@pytest.mark.parametrize("d", [f32, f64])
def test_gelu_chain_bit_for_bit(be, nthreads, d):
    x = np.random.default_rng(0).standard_normal(N).astype(d.numpy) * 4
    x[:4] = [np.inf, -np.inf, np.nan, -0.0]
    sc = (0.5, 0.7978845608, 0.044715, 1.0)
    ref = interpret(gelu_kernel(d), be, [x], sc, x.shape)[0]
    same_bits(blocked(be, gelu_kernel(d), [x], sc, x.shape)[0], ref)


def test_rows_with_broadcast_bias_and_non_ufunc_steps(be, nthreads):
    # relu(x * w + bias) as where(gt(.., 0), .., 0), plus a sigmoid (a flex function, not a ufunc) and a cast
    d = f32
    body = (L(0, d), L(1, d), L(2, d), S(0, d), B("mul", 0, 1, d), B("add", 4, 2, d), B("gt", 5, 3, b),
            Instr("where", (6, 5, 3), d), U("sigmoid", 7, d), Instr("cast", (8,), f64))
    k = Kernel(2, (d, d, d), 1, body, (7, 9))
    r = np.random.default_rng(1)
    shape = (300, 700)
    x = r.standard_normal(shape).astype(np.float32)
    w = r.standard_normal((300, 1)).astype(np.float32)  # sliced with the rows
    bias = r.standard_normal(700).astype(np.float32)  # broadcast whole to every block
    ref = interpret(k, be, [x, w, bias], (0.0,), shape)
    res = blocked(be, k, [x, w, bias], (0.0,), shape)
    for a, want in zip(res, ref):
        same_bits(a, want)


def test_in_place_update_of_an_input(be, nthreads):
    # p = p - lr * g / (sqrt(v) + eps), written into p itself: every read of a block's p precedes its write
    d = f32
    body = (L(0, d), L(1, d), L(2, d), S(0, d), S(1, d), U("sqrt", 2, d), B("add", 5, 4, d), B("div", 1, 6, d),
            B("mul", 7, 3, d), B("sub", 0, 8, d), B("mul", 0, 9, d))
    k = Kernel(1, (d, d, d), 2, body, (9, 10))
    r = np.random.default_rng(2)
    p, g, v = (r.standard_normal(N).astype(np.float32) for _ in range(3))
    v = np.abs(v)
    ref = interpret(k, be, [p, g, v], (1e-3, 1e-8), p.shape)
    q = p.copy()
    res = blocked(be, k, [q, g, v], (1e-3, 1e-8), q.shape, [q, None])
    assert res[0] is q
    same_bits(q, ref[0])
    same_bits(res[1], ref[1])  # read p before this block of it was overwritten


def test_repeated_load_and_scalar_outputs(be, nthreads):
    d = f64
    body = (L(0, d), S(0, d), B("mul", 0, 1, d), B("add", 2, 0, d))
    k = Kernel(1, (d,), 1, body, (3, 3, 0, 1, 2))
    x = np.random.default_rng(3).standard_normal(N)
    ref = interpret(k, be, [x], (2.5,), x.shape)
    res = blocked(be, k, [x], (2.5,), x.shape)
    for a, want in zip(res, ref):
        same_bits(a, want)
    assert not np.shares_memory(res[0], res[1]) and not np.shares_memory(res[2], x)


def test_given_fresh_targets_are_returned(be):
    k = gelu_kernel(f32)
    x = np.random.default_rng(4).standard_normal((512, 300)).astype(np.float32)
    out = np.empty_like(x)
    sc = (0.5, 0.7978845608, 0.044715, 1.0)
    res = blocked(be, k, [x], sc, x.shape, [out])
    assert res[0] is out
    same_bits(out, interpret(k, be, [x], sc, x.shape)[0])


def test_integer_steps_run_through_the_backend_bit_for_bit(be, nthreads):
    # floor_divide and remainder on int32 (backend calls per block), cast to float32, then float ufunc steps
    d = i32
    body = (L(0, d), L(1, d), L(2, f32), B("floor_divide", 0, 1, d), B("remainder", 0, 1, d), B("add", 3, 4, d),
            Instr("cast", (5,), f32), B("mul", 6, 2, f32), U("exp", 7, f32))
    k = Kernel(1, (d, d, f32), 0, body, (8, 5))
    r = np.random.default_rng(5)
    x = r.integers(-1000, 1000, N, dtype=np.int32)
    y = r.integers(1, 50, N, dtype=np.int32)
    z = r.standard_normal(N).astype(np.float32) * 1e-3
    for got, want in zip(blocked(be, k, [x, y, z], (), x.shape), interpret(k, be, [x, y, z], (), x.shape)):
        same_bits(got, want)


def test_kernels_without_a_float_ufunc_step_are_not_blocked(be):
    k = Kernel(1, (i32, i32), 0, (L(0, i32), L(1, i32), B("floor_divide", 0, 1, i32)), (2,))
    with pytest.raises(ValueError):
        fusion_blocks.BlockPlan(k, be)


def test_two_targets_in_one_memory_take_the_numpy_path(be):
    d = f32
    k = Kernel(1, (d,), 0, (L(0, d), U("exp", 0, d), U("tanh", 1, d)), (1, 2))
    x = np.random.default_rng(10).standard_normal(N).astype(np.float32)
    out = np.empty_like(x)
    fk = be.fusion_compile(k)
    assert fk._try_blocked([x], (), x.shape, [out, out]) is None
    fk.run_path("blocked", [x], (), x.shape, [out, out])
    same_bits(out, np.tanh(np.exp(x)))  # the numpy path writes the outputs in order: the last one stays


@pytest.mark.parametrize("case", ["small", "strided", "reduction", "numpy-scalar", "overlapping-target"])
def test_calls_the_blocked_path_does_not_take(be, case):
    d = f32
    sc = (0.5, 0.7978845608, 0.044715, 1.0)
    k = gelu_kernel(d)
    x = np.random.default_rng(6).standard_normal(N).astype(np.float32)
    outs = None
    if case == "small":
        x = x[:1000]
    elif case == "strided":
        x = np.random.default_rng(6).standard_normal(2 * N).astype(np.float32)[::2]
    elif case == "reduction":
        k = Kernel(1, (d,), 0, (L(0, d), B("mul", 0, 0, d)), (1,), reduce=("sum", (0,)))
    elif case == "numpy-scalar":
        sc = (np.float64(0.5),) + sc[1:]  # not weak: numpy would compute in float64, so the backend decides
    else:
        buf = np.random.default_rng(7).standard_normal(N + 1).astype(np.float32)
        x, outs = buf[1:], [buf[:-1]]
    fk = be.fusion_compile(k)
    sc = sc if case != "reduction" else ()
    assert fk._try_blocked([x], sc, x.shape, outs) is None
    if case != "reduction":  # the kernel still gives the numpy path's bits through run_path("blocked")
        want = interpret(k, be, [x.copy()], sc, x.shape)[0]
        got = fk.run_path("blocked", [x], sc, x.shape, outs)[0]
        same_bits(got, want)


def test_automatic_choice_never_changes_bits(be):
    k = gelu_kernel(f32)
    fk = be.fusion_compile(k)
    x = np.random.default_rng(8).standard_normal(N).astype(np.float32)
    sc = (0.5, 0.7978845608, 0.044715, 1.0)
    ref = interpret(k, be, [x], sc, x.shape)[0]
    paths = set()
    for _ in range(4 * fusion.TRIALS):
        r = fk([x], sc, x.shape, [None])[0]
        if fk.last_path != "numexpr":  # numexpr's tanh is the C library's (see test_fusion.py)
            same_bits(r, ref)
        paths.add(fk.last_path)
    assert "blocked" in paths  # timed among the candidates
    assert fk.path_for(N) in ("numpy", "numexpr", "blocked")


def test_scratch_slots_are_reused_as_values_die(be):
    # the GELU chain's nine ops need two scratch blocks (the output's rows take the last result)
    plan = fusion_blocks.BlockPlan(gelu_kernel(f32), be)
    steps, dtypes = plan._schedule(False)
    assert len(dtypes) <= 2
    assert [s[0] for s in steps] == ["u"] * 9
    assert steps[-1][-1] == -1  # the last op writes output 0's rows


def test_a_kernel_numexpr_cannot_compute_is_still_fused_by_blocks(be):
    # exp and tanh only: numexpr would call the C library (inexact), so before blocks flex declined to fuse it
    d = f32
    k = Kernel(1, (d,), 0, (L(0, d), U("exp", 0, d), U("tanh", 1, d)), (2,))
    fk = be.fusion_compile(k)
    assert fk is not None and fk._plan is None
    x = np.random.default_rng(9).standard_normal(N).astype(np.float32)
    same_bits(fk.run_path("blocked", [x], (), x.shape)[0], np.tanh(np.exp(x)))
    same_bits(fk.run_path("numexpr", [x], (), x.shape)[0], np.tanh(np.exp(x)))  # no numexpr: the numpy path
    # a reduction of inexact ops: neither path, so no fused kernel
    assert be.fusion_compile(Kernel(1, (d,), 0, (L(0, d), U("exp", 0, d)), (1,), reduce=("sum", (0,)))) is None


def test_calls_whose_scalars_rule_out_paths_still_settle_on_a_choice(be):
    # a numpy float64 scalar: neither numexpr nor blocks take it, so the class is measured on the numpy path alone
    # and settles, rather than timing (and keeping) every call
    k = gelu_kernel(f32)
    fk = be.fusion_compile(k)
    x = np.random.default_rng(11).standard_normal(N).astype(np.float32)
    sc = (np.float64(0.5), 0.7978845608, 0.044715, 1.0)
    ref = interpret(k, be, [x], sc, x.shape)[0]
    for _ in range(2 * fusion.TRIALS):
        same_bits(fk([x], sc, x.shape, [None])[0], ref)
        assert fk.last_path == "numpy"
    assert fk.path_for(N) == "numpy" and not fk._timings
