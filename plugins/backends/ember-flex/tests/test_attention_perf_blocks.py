"""The blocked kernels of flex's attention (ember_flex.attention_kernels): the forward's blocks of heads or rows,
the causal row blocks that skip the keys after their last row, the max-free softmax where the scores are bounded,
the backward's blocks of heads, and the blocks on flex's thread pool. Every case runs with tiny blocks (many
blocks, the pool forced on) and is compared with torch, with the kernel's own one-block result, and bit for bit
across thread counts. The output-only forward (inference) equals the forward's output bit for bit and never holds
the (..., L, S) weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ember_flex import attention_kernels as K
from ember_flex import threads

torch = pytest.importorskip("torch")
TF = torch.nn.functional

TOL = {"float32": {"rtol": 2e-5, "atol": 2e-6}, "float64": {"rtol": 1e-10, "atol": 1e-12}}

# (q, k, v, mask shape or None): 4-D heads, L != S, broadcast batch dims, unbatched 2-D, 3-D
SHAPES = {
    "heads": ((3, 4, 24, 8), (3, 4, 24, 8), (3, 4, 24, 8), None),
    "L<S": ((2, 3, 20, 8), (2, 3, 33, 8), (2, 3, 33, 5), None),
    "L>S": ((2, 3, 33, 8), (2, 3, 20, 8), (2, 3, 20, 5), None),
    "bcast": ((1, 3, 18, 4), (2, 1, 21, 4), (2, 3, 21, 6), None),
    "2d": ((40, 8), (37, 8), (37, 3), None),
    "3d": ((5, 19, 8), (5, 23, 8), (5, 23, 8), None),
    "mask-2d": ((2, 3, 20, 8), (2, 3, 33, 8), (2, 3, 33, 8), (20, 33)),
    "mask-kpm": ((2, 3, 20, 8), (2, 3, 33, 8), (2, 3, 33, 8), (2, 1, 1, 33)),
    "mask-full": ((2, 3, 20, 8), (2, 3, 33, 8), (2, 3, 33, 8), (2, 3, 20, 33)),
}


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Blocks of 64 scores and causal row blocks of 4 rows: dozens of blocks even for these small shapes; the
    pool runs them (its size threshold lowered)."""
    monkeypatch.setattr(K, "BLOCK", 64)
    monkeypatch.setattr(K, "CAUSAL_ROWS", 4)
    monkeypatch.setattr(threads, "min_elems", 1)
    # the pool stays on however busy the machine is (it would go cold and run the blocks serially: same bits)
    monkeypatch.setattr(threads, "_MEASURE_FROM_CHUNK", 1 << 62)  # the pool never judges its speed: never cold
    yield


def _data(shapes: tuple[Any, ...], dtype: str, mask_kind: str | None, seed: int = 0,
          magnitude: float = 1.0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    qs, ks, vs, ms = shapes
    q, k, v = (rng.standard_normal(s).astype(dtype) * magnitude for s in (qs, ks, vs))
    m = None
    if ms is not None and mask_kind == "bool":
        m = rng.random(ms) < 0.7
        m[..., 0] = True
    elif ms is not None and mask_kind == "float":
        m = rng.standard_normal(ms).astype(dtype)
    return q, k, v, m


def _torch(q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray | None, **kw: Any) -> np.ndarray:
    t = [torch.from_numpy(a) for a in (q, k, v)]
    return TF.scaled_dot_product_attention(*t, attn_mask=None if m is None else torch.from_numpy(m), **kw).numpy()


def _kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray | None, drop: np.ndarray | None = None,
            **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    E = q.shape[-1]
    kw.setdefault("scale", 1.0 / np.sqrt(E))
    return K.sdpa(None, q, k, v, m, drop, **kw)


def _one_block(*args: Any, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """The kernel with every block as large as the whole attention, serially."""
    saved = K.BLOCK, K.CAUSAL_ROWS, threads.min_elems
    K.BLOCK, K.CAUSAL_ROWS, threads.min_elems = 1 << 40, 1 << 40, 1 << 62
    try:
        return _kernel(*args, **kw)
    finally:
        K.BLOCK, K.CAUSAL_ROWS, threads.min_elems = saved


# (shape case, mask kind, is_causal): is_causal takes no mask
CASES = [(c, kind, causal) for c, s in SHAPES.items()
         for kind, causal in ([(None, False), (None, True)] if s[3] is None else [("bool", False), ("float", False)])]


@pytest.mark.parametrize("softmax", ["auto", "stable"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,mask_kind,causal", CASES)
def test_blocks_against_torch_and_one_block(tiny_blocks: None, monkeypatch: pytest.MonkeyPatch, softmax: str,
                                            dtype: str, case: str, mask_kind: str | None, causal: bool) -> None:
    """"auto": these scores are bounded, so the max-free softmax runs; "stable": the max-subtracting one. The
    output-only forward gives the forward's output bit for bit."""
    if softmax == "stable":
        monkeypatch.setattr(K, "_EXP_LIMIT", {4: -1.0, 8: -1.0})
    q, k, v, m = _data(SHAPES[case], dtype, mask_kind)
    out, attn = _kernel(q, k, v, m, is_causal=causal)
    np.testing.assert_allclose(out, _torch(q, k, v, m, is_causal=causal), **TOL[dtype])
    # the output-only forward (inference): the same blocks and arithmetic, its scores in a scratch buffer
    only = K.sdpa_out(None, q, k, v, m, None, scale=1.0 / np.sqrt(q.shape[-1]), is_causal=causal)
    assert only.dtype == out.dtype and np.array_equal(only, out)
    one_out, one_attn = _one_block(q, k, v, m, is_causal=causal)
    np.testing.assert_allclose(out, one_out, **TOL[dtype])
    np.testing.assert_allclose(attn, one_attn, **TOL[dtype])
    # the probabilities: each row sums to one, masked positions (the causal triangle included) exactly zero
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-5 if dtype == "float32" else 1e-12)
    if causal:
        L, S = attn.shape[-2:]
        assert np.all(attn[..., np.triu(np.ones((L, S), bool), 1)] == 0)


@pytest.mark.parametrize("magnitude", [1.0, 40.0])
@pytest.mark.parametrize("causal", [False, True])
def test_bits_do_not_depend_on_the_thread_count(tiny_blocks: None, magnitude: float, causal: bool) -> None:
    """The blocks on the pool with 2 and 4 threads, and serially: the same bits (magnitude 40 takes the stable
    softmax, 1 the max-free one)."""
    q, k, v, _ = _data(SHAPES["L<S"], "float32", None, magnitude=magnitude)
    before = threads.get_num_threads()
    results = []
    try:
        for n in (1, 2, 4):
            threads.set_num_threads(n)
            threads.min_elems = 1  # set_num_threads resets it
            pooled = threads.pool_stats()["pooled"]
            results.append(_kernel(q, k, v, None, is_causal=causal))
            assert (threads.pool_stats()["pooled"] > pooled) == (n > 1)  # the blocks ran on the pool
    finally:
        threads.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert np.array_equal(a, b)
    np.testing.assert_allclose(results[0][0], _torch(q, k, v, None, is_causal=causal), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("magnitude", [0.01, 1.0, 8.0, 100.0])
@pytest.mark.parametrize("mask_kind", [None, "float"])
def test_large_and_small_scores_either_softmax(tiny_blocks: None, magnitude: float, mask_kind: str | None) -> None:
    """Scores from near zero to far outside exp's float32 range: the max-free softmax where bounded, the stable
    one elsewhere; both as torch's (no overflow, no NaN)."""
    q, k, v, m = _data(SHAPES["mask-kpm"], "float32", mask_kind, seed=2, magnitude=magnitude)
    out, attn = _kernel(q, k, v, m)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(attn))
    ref = _torch(q, k, v, m)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(1.0, magnitude))


def test_float_mask_of_large_negatives_is_not_a_hidden_row(tiny_blocks: None) -> None:
    """A row whose every position has a large negative float mask value (-1e4, not -inf) is a normal softmax row
    (uniform here), as in torch: the max-free form must not turn it into an all-zero row."""
    q, k, v, _ = _data(SHAPES["mask-2d"], "float32", None, seed=3)
    m = np.zeros((20, 33), np.float32)
    m[5] = -1e4
    m[7, 3:] = -1e4
    out, attn = _kernel(q, k, v, m)
    np.testing.assert_allclose(out, _torch(q, k, v, m), **TOL["float32"])
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("kind", ["bool", "float-inf", "causal-free"])
def test_fully_masked_rows_give_zeros_in_every_block(tiny_blocks: None, kind: str) -> None:
    q, k, v, _ = _data(SHAPES["mask-2d"], "float64", None, seed=4)
    keep = np.ones((20, 33), bool)
    keep[[0, 6, 19]] = False
    m = keep if kind == "bool" else np.where(keep, 0.0, -np.inf)
    if kind == "causal-free":  # a float mask with finite values besides the -inf rows
        m = np.where(keep, np.random.default_rng(5).standard_normal((20, 33)), -np.inf)
    out, attn = _kernel(q, k, v, m)
    assert np.all(out[..., [0, 6, 19], :] == 0) and np.all(attn[..., [0, 6, 19], :] == 0)
    np.testing.assert_allclose(out, _torch(q, k, v, m), **TOL["float64"])


def test_dropout_and_gqa_in_blocks(tiny_blocks: None) -> None:
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 6, 22, 8))
    k, v = rng.standard_normal((2, 2, 25, 8)), rng.standard_normal((2, 3, 25, 5))
    drop = (rng.random((2, 6, 22, 25)) < 0.7) / 0.7
    for causal in (False, True):
        out, attn = _kernel(q, k, v, None, drop, is_causal=causal, repeat_k=3, repeat_v=2)
        kr, vr = np.repeat(k, 3, axis=-3), np.repeat(v, 2, axis=-3)
        ref_attn = torch.softmax(torch.from_numpy(q @ kr.swapaxes(-1, -2) / np.sqrt(8)).masked_fill(
            torch.ones(22, 25, dtype=torch.bool).triu(1) if causal else torch.zeros(22, 25, dtype=torch.bool),
            float("-inf")), -1).numpy()
        np.testing.assert_allclose(attn, ref_attn, **TOL["float64"])
        np.testing.assert_allclose(out, (ref_attn * drop) @ vr, **TOL["float64"])


@pytest.mark.parametrize("batch,L,S,causal", [((), 1, 1, False), ((3, 4), 24, 24, False), ((3, 4), 24, 33, True),
                                              ((2,), 130, 7, True), ((5, 1, 3), 9, 600, False),
                                              ((2, 8), 512, 512, False), ((8, 8), 128, 128, True)])
@pytest.mark.parametrize("block", [64, 1 << 17])
def test_plan_covers_every_row_once(monkeypatch: pytest.MonkeyPatch, batch: tuple[int, ...], L: int, S: int,
                                    causal: bool, block: int) -> None:
    monkeypatch.setattr(K, "BLOCK", block)
    seen = np.zeros(batch + (L,), np.int64)
    plan = K._plan(batch, L, S, causal)
    for b, r0, r1 in plan:
        seen[b + (Ellipsis, slice(r0, r1))] += 1
    assert np.all(seen == 1)
    if block == 1 << 17 and not causal and int(np.prod(batch)) * L * S <= block:
        assert len(plan) == 1  # small attention: one block, no per-block cost
    for b, r0, r1 in plan:  # a block holds at most BLOCK scores, or one batch entry's 8 rows
        heads = int(np.prod(np.empty(batch)[b].shape)) if batch else 1
        assert heads * (r1 - r0) * S <= max(block, 8 * S) or heads == 1


def test_blas_thread_count_is_restored(tiny_blocks: None) -> None:
    from threadpoolctl import ThreadpoolController

    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    before = [lib.num_threads for lib in libs]
    pool = threads.get_num_threads()
    q, k, v, _ = _data(SHAPES["heads"], "float32", None)
    try:
        threads.set_num_threads(max(2, pool))
        threads.min_elems = 1
        _kernel(q, k, v, None)
    finally:
        threads.set_num_threads(pool)
    assert [lib.num_threads for lib in libs] == before


def _backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray | None, drop: np.ndarray | None,
              g: np.ndarray, **kw: Any) -> tuple[np.ndarray, ...]:
    out, attn = _kernel(q, k, v, m, drop, **kw)
    kw.setdefault("scale", 1.0 / np.sqrt(q.shape[-1]))
    return K.sdpa_backward(None, q, k, v, m, drop, out, attn, g, **kw)


@pytest.mark.parametrize("case,mask_kind,causal", CASES)
def test_backward_blocks_against_torch(tiny_blocks: None, case: str, mask_kind: str | None, causal: bool) -> None:
    """dq, dk, dv (and a float mask's gradient) in blocks of heads on the pool, against torch's autograd; the
    broadcast batch dims summed back to each input's shape."""
    q, k, v, m = _data(SHAPES[case], "float64", mask_kind, seed=8)
    mask_grad = m is not None and m.dtype != np.bool_
    t_in = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    t_m = None if m is None else torch.tensor(m, requires_grad=mask_grad)
    t_out = TF.scaled_dot_product_attention(*t_in, attn_mask=t_m, is_causal=causal)
    g = np.random.default_rng(9).standard_normal(tuple(t_out.shape))
    t_out.backward(torch.from_numpy(g))
    got = _backward(q, k, v, m, None, g, is_causal=causal, mask_grad=mask_grad)
    want = [t.grad.numpy() for t in t_in] + ([t_m.grad.numpy()] if mask_grad else [])
    assert len(got) == len(want)
    for name, a, b in zip("qkvm"[:len(got)], got, want, strict=True):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, **TOL["float64"], err_msg=f"d{name}")


def test_backward_gqa_dropout_and_thread_count(tiny_blocks: None) -> None:
    """GQA repeats and dropout factors in blocks; the same bits serially and on 2 and 4 threads, and the same
    numbers as one block."""
    rng = np.random.default_rng(10)
    q = rng.standard_normal((2, 6, 22, 8)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 25, 8)).astype(np.float32), rng.standard_normal((2, 3, 25, 5)).astype(np.float32)
    drop = ((rng.random((2, 6, 22, 25)) < 0.7) / 0.7).astype(np.float32)
    g = rng.standard_normal((2, 6, 22, 5)).astype(np.float32)
    kw = {"is_causal": True, "repeat_k": 3, "repeat_v": 2}
    before = threads.get_num_threads()
    results = []
    try:
        for n in (1, 2, 4):
            threads.set_num_threads(n)
            threads.min_elems = 1
            results.append(_backward(q, k, v, None, drop, g, **kw))
    finally:
        threads.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert np.array_equal(a, b)
    out, attn = _one_block(q, k, v, None, drop, **kw)
    one = K.sdpa_backward(None, q, k, v, None, drop, out, attn, g, scale=1.0 / np.sqrt(8), **kw)
    for a, b in zip(results[0], one, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compile_replay_is_bit_identical_to_eager(tiny_blocks: None) -> None:
    """Training steps of a causal pre-norm encoder layer (blocked kernels on the pool, dropout on) through
    ember.compile's replay give exactly eager's losses and weights."""
    import ember
    import ember.nn.functional as F

    replays = []

    def run(compiled: bool) -> tuple[list[float], dict[str, np.ndarray]]:
        dev = ember.Device.parse("flex+autodiff")  # a DeviceError (skipped) without ember-autodiff
        dev.seed(0)
        layer = ember.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, activation="gelu", batch_first=True,
                                                 norm_first=True, device=dev)
        opt = ember.optim.AdamW(layer.parameters(), lr=1e-2)
        rng = np.random.default_rng(11)
        x = ember.tensor(rng.standard_normal((3, 24, 16)).astype(np.float32), device=dev)
        y = ember.tensor(rng.standard_normal((3, 24, 16)).astype(np.float32), device=dev)

        def step(x: Any, y: Any) -> Any:
            opt.zero_grad()
            loss = F.mse_loss(layer(x, is_causal=True), y)
            loss.backward()
            opt.step()
            return loss

        f = ember.compile(step) if compiled else step
        losses = [float(f(x, y).item()) for _ in range(3)]
        if compiled:
            replays.append(f.stats()["replays"])
        return losses, {k: v.detach().numpy().copy() for k, v in layer.state_dict().items()}

    (le, we), (lc, wc) = run(False), run(True)
    assert replays[0] >= 1  # the later steps replayed the recording
    assert le == lc
    assert we.keys() == wc.keys() and all(np.array_equal(we[k], wc[k]) for k in we)


# -- the output-only forward (inference) -------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_out_only_dropout_gqa_half_and_thread_count(tiny_blocks: None, causal: bool) -> None:
    """Dropout factors and GQA repeats in blocks, float16 in float32 work: sdpa's ``out`` bit for bit, on 1, 2 and 4
    threads."""
    rng = np.random.default_rng(21)
    q = rng.standard_normal((2, 6, 22, 8)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 25, 8)).astype(np.float32), rng.standard_normal((2, 3, 25, 5)).astype(np.float32)
    drop = ((rng.random((2, 6, 22, 25)) < 0.7) / 0.7).astype(np.float32)
    kw = {"scale": 0.3, "is_causal": causal, "repeat_k": 3, "repeat_v": 2}
    before = threads.get_num_threads()
    try:
        for n in (1, 2, 4):
            threads.set_num_threads(n)
            threads.min_elems = 1
            for args in ((q, k, v, None, drop), (q, k, v, None, None),
                         tuple(None if a is None else a.astype(np.float16) for a in (q, k, v, None, drop))):
                got = K.sdpa_out(None, *args, **kw)
                want, _ = K.sdpa(None, *args, **kw)
                assert got.dtype == args[0].dtype and np.array_equal(got, want), (n, args[0].dtype)
    finally:
        threads.set_num_threads(before)


def test_out_only_never_holds_the_weights() -> None:
    """The output-only forward's peak traced memory stays far below one (..., L, S) buffer, which the forward that
    keeps the weights allocates (numpy reports its buffers to tracemalloc)."""
    import tracemalloc

    rng = np.random.default_rng(22)
    q, k, v = (rng.standard_normal((1, 8, 1024, 16)).astype(np.float32) for _ in range(3))
    weights = 8 * 1024 * 1024 * 4  # 32 MiB of float32 probabilities

    def peak(fn: Any) -> int:
        tracemalloc.start()
        try:
            fn(None, q, k, v, None, None, scale=0.25)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    full, only = peak(K.sdpa), peak(K.sdpa_out)
    assert full >= weights  # the instrument sees numpy's buffers
    # a block's scores (BLOCK float32: 0.5-1 MiB) and its rows of q per thread at once, and out (512 KiB)
    bound = threads.get_num_threads() * K.BLOCK * 4 + (1 << 20)
    assert only < min(bound, weights // 2), (full, only, bound)


def test_out_only_empty_shapes() -> None:
    q = np.ones((2, 0, 4), np.float32)
    k = np.ones((2, 3, 4), np.float32)
    assert K.sdpa_out(None, q, k, k, None, None, scale=1.0).shape == (2, 0, 4)
    out = K.sdpa_out(None, np.ones((2, 3, 4), np.float32), np.ones((2, 0, 4), np.float32),
                     np.ones((2, 0, 5), np.float32), None, None, scale=1.0)
    assert out.shape == (2, 3, 5) and np.all(out == 0)


@pytest.mark.parametrize("cached", [True, False])
def test_causal_triangle(monkeypatch: pytest.MonkeyPatch, cached: bool) -> None:
    """The keys each row hides under is_causal: right of the diagonal, for L == S, L < S and L > S; shapes up to
    _TRI_CACHED positions share one read-only array, larger ones are built per call (same values)."""
    if not cached:
        monkeypatch.setattr(K, "_TRI_CACHED", 0)
    for L, S in ((1, 1), (5, 8), (8, 5), (33, 33)):
        tri = K._causal_hidden(L, S)
        assert np.array_equal(tri, np.triu(np.ones((L, S), np.bool_), 1))
        assert (K._causal_hidden(L, S) is tri) == cached
        assert tri.flags.writeable != cached
