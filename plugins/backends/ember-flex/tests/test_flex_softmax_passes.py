"""The fewer passes of flex's attention and layer-norm kernels (ember_flex.attention_kernels, norm_kernels):

* attention: without a mask the scores come out in base 2 (log2(e) folded into q's scale) for exp2; with a mask
  they keep natural units and exp. The softmax's normalisation is applied to ``exp(s) @ v`` (L*E multiplies) and,
  for the kept probabilities, to the (L, S) block after that GEMM. Checked against float64 references built here
  (probabilities and output), on both softmax forms (max-free where the scores are bounded, stable elsewhere).
* layer norm: y = ((x - mean) * weight) * rstd + bias, the weight and bias through a tile of rows, the rows far
  from zero recentred with the same order of operations; against float64 and torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember_flex import attention_kernels as A
from ember_flex import norm_kernels as N

torch = pytest.importorskip("torch")

TOL = {"float32": {"rtol": 2e-5, "atol": 2e-6}, "float64": {"rtol": 1e-10, "atol": 1e-12}}


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
               causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """float64 softmax(q k^T * scale + mask) and its product with v (torch's math path, rows all hidden -> 0)."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = q64 @ np.swapaxes(k64, -1, -2) * scale
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.triu(np.ones((L, S), bool), 1), -np.inf, s)
    if mask is not None and mask.dtype == np.bool_:
        s = np.where(mask, s, -np.inf)
    elif mask is not None:
        s = s + mask.astype(np.float64)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    tot = e.sum(-1, keepdims=True)
    p = e / np.where(tot == 0, 1.0, tot)
    return p @ v64, p


def _data(dtype: str, magnitude: float, mask_kind: str | None, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((2, 3, n, 16)).astype(dtype) * magnitude for n in (40, 56))
    v = rng.standard_normal((2, 3, 56, 8)).astype(dtype)
    m = None
    if mask_kind == "bool":
        m = rng.random((40, 56)) < 0.6
        m[:, 0] = True
    elif mask_kind == "float":
        m = rng.standard_normal((2, 1, 1, 56)).astype(dtype)
    return q, k, v, m


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("magnitude,stable", [(0.5, False), (0.5, True), (8.0, False)])  # bounded scores: max-free
@pytest.mark.parametrize("mask_kind,causal", [(None, False), (None, True), ("bool", False), ("float", False)])
def test_probabilities_and_output_against_float64(monkeypatch: pytest.MonkeyPatch, dtype: str, magnitude: float,
                                                  stable: bool, mask_kind: str | None, causal: bool) -> None:
    """Small scores take the max-free softmax unless forced to the stable one; large ones (8.0) take it anyway."""
    if stable:
        monkeypatch.setattr(A, "_EXP_LIMIT", {4: -1.0, 8: -1.0})
    q, k, v, m = _data(dtype, magnitude, mask_kind)
    scale = 0.3
    out, attn = A.sdpa(None, q, k, v, m, None, scale=scale, is_causal=causal)
    ref_out, ref_p = _reference(q, k, v, m, scale, causal)
    tol = TOL[dtype] if magnitude < 1 else {"rtol": 2e-4, "atol": 2e-5} if dtype == "float32" else TOL[dtype]
    np.testing.assert_allclose(attn, ref_p, **tol)
    np.testing.assert_allclose(out, ref_out, **tol)
    only = A.sdpa_out(None, q, k, v, m, None, scale=scale, is_causal=causal)
    assert np.array_equal(only, out)  # the output-only kernel: the forward's bits
    if causal:
        assert np.all(attn[..., np.triu(np.ones((40, 56), bool), 1)] == 0)


def test_the_output_is_the_normalised_product_of_the_exponentials() -> None:
    """``out`` is ``(exp(s) @ v) * (1 / rowsum)``; the kept probabilities times v agree with it to rounding."""
    q, k, v, _ = _data("float64", 1.0, None, seed=4)
    out, attn = A.sdpa(None, q, k, v, None, None, scale=0.25)
    np.testing.assert_allclose(out, attn @ v, rtol=1e-12, atol=1e-13)


def test_scores_in_base_two_match_torch_without_a_mask() -> None:
    """The unmasked float32 attention of the seed transformer's head shape (exp2 of base-2 scores) against torch."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 128, 64)).astype(np.float32) for _ in range(3))
    got = A.sdpa_out(None, q, k, v, None, None, scale=0.125)
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v))).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_zero_float_mask_and_no_mask_agree() -> None:
    """A float mask of zeros (natural units and exp) and no mask (base 2 and exp2): different roundings of one
    softmax, equal within float32's tolerance."""
    q, k, v, _ = _data("float32", 1.0, None, seed=5)
    zero = np.zeros((40, 56), np.float32)
    a = A.sdpa_out(None, q, k, v, zero, None, scale=0.25)
    b = A.sdpa_out(None, q, k, v, None, None, scale=0.25)
    np.testing.assert_allclose(a, b, **TOL["float32"])


def _torch_ln(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float) -> Any:
    t = torch.nn.functional.layer_norm(torch.from_numpy(x), (x.shape[-1],),
                                       None if w is None else torch.from_numpy(w),
                                       None if b is None else torch.from_numpy(b), eps)
    return t.numpy()


@pytest.mark.parametrize("rows,d", [(1024, 512), (333, 40), (7, 3000)])  # several blocks and tiles, remainders
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_layer_norm_affine_orders_against_float64_and_torch(rows: int, d: int, affine: str) -> None:
    rng = np.random.default_rng(rows + d)
    x = (rng.standard_normal((rows, d)) * 3 + 1).astype(np.float32)
    w = rng.uniform(0.5, 2, d).astype(np.float32) if affine in ("both", "weight") else None
    b = rng.standard_normal(d).astype(np.float32) if affine in ("both", "bias") else None
    y, mean, rstd = N.layer_norm(None, x, w, b, normalized_shape=(d,))
    x64 = x.astype(np.float64)
    y64 = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    if w is not None:
        y64 = y64 * w
    if b is not None:
        y64 = y64 + b
    np.testing.assert_allclose(y, y64, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(y, _torch_ln(x, w, b, 1e-5), rtol=1.3e-6, atol=1e-5)


def test_layer_norm_recentred_rows_take_the_blocked_order() -> None:
    """A row far from zero (recentred) and the same row shifted near zero: the same y up to the mean's rounding,
    with weight and bias (the recentring multiplies by the weight before rstd, as the blocked pass)."""
    rng = np.random.default_rng(31)
    base = rng.standard_normal((4, 256)).astype(np.float32)
    w = rng.uniform(0.5, 2, 256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    far = base + np.float32(3e4)
    y_far = N.layer_norm(None, far, w, b, normalized_shape=(256,))[0]
    y_near = N.layer_norm(None, base, w, b, normalized_shape=(256,))[0]
    np.testing.assert_allclose(y_far, y_near, rtol=0, atol=2e-2)  # far's float32 values carry ~2e-3 rounding
    np.testing.assert_allclose(y_far, _torch_ln(far.astype(np.float64), w.astype(np.float64),
                                                b.astype(np.float64), 1e-5), rtol=0, atol=5e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["none", "causal", "bool"])
def test_stable_softmax_floor_keeps_hidden_positions_zero(dtype: str, kind: str) -> None:
    """Scores spread far beyond exp's normal range (the stable form floors them where exp's results would be
    subnormal): hidden positions and fully hidden rows stay exactly zero, tiny weights stay tiny and >= 0, and the
    result matches float64."""
    rng = np.random.default_rng(11)
    mag = 12.0 if dtype == "float32" else 40.0
    q, k = (rng.standard_normal((2, 2, 24, 8)).astype(dtype) * mag for _ in range(2))
    v = rng.standard_normal((2, 2, 24, 8)).astype(dtype)
    m = None
    if kind == "bool":
        m = rng.random((24, 24)) < 0.5
        m[:, 0] = True
        m[3] = False  # a fully hidden row: zeros
    causal = kind == "causal"
    out, attn = A.sdpa(None, q, k, v, m, None, scale=1.0, is_causal=causal)
    ref_out, ref_p = _reference(q, k, v, m, 1.0, causal)
    assert np.all(attn >= 0) and np.all(np.isfinite(attn))
    hidden = np.triu(np.ones((24, 24), bool), 1) if causal else (~m if m is not None else np.zeros((24, 24), bool))
    assert np.all(attn[..., hidden] == 0)
    if kind == "bool":
        assert np.all(out[..., 3, :] == 0)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-9, "atol": 1e-11}
    np.testing.assert_allclose(attn, ref_p, **tol)
    np.testing.assert_allclose(out, ref_out, **tol)
    assert np.array_equal(A.sdpa_out(None, q, k, v, m, None, scale=1.0, is_causal=causal), out)


@pytest.mark.parametrize("entries,want", [
    ({"index0": ("1", "48K"), "index2": ("2", "2048K"), "index3": ("3", "105M")}, 2 << 20),
    ({"index0": ("1", "32K"), "index1": ("2", "1280K")}, 1280 << 10),
    ({"index0": ("1", "32K")}, 0),
    ({"index2": ("2", "big")}, 0),
])
def test_l2_size_from_sysfs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, entries: dict[str, tuple[str, str]],
                            want: int) -> None:
    """The attention's block size follows one core's L2 (1 MiB of float32 scores from 2 MiB of L2 on): its size is
    read from sysfs's cache entries, 0 where there is none or it does not parse."""
    import glob

    for name, (level, size) in entries.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    real = glob.glob
    monkeypatch.setattr(glob, "glob", lambda pattern: real(str(tmp_path / "index*")))
    assert A._l2_bytes() == want
