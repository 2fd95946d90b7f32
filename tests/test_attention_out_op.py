"""ember.ops.attention.sdpa_out called directly: typed errors naming the op on malformed operands, and the same
result from several threads at once as from one (flex's block scratch is per call)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import ember
from ember.errors import DTypeError, ShapeError
from ember.ops.attention import sdpa, sdpa_out


def _qkv(seed: int = 0, dtype: str = "float32") -> tuple[ember.Tensor, ...]:
    rng = np.random.default_rng(seed)
    return tuple(ember.tensor(rng.standard_normal(s).astype(dtype)) for s in ((2, 3, 8, 4), (2, 3, 9, 4), (2, 3, 9, 5)))


@pytest.mark.parametrize("bad, error, words", [
    ("key_width", ShapeError, "expected query (..., L, E)"),
    ("value_length", ShapeError, "expected query (..., L, E)"),
    ("value_dtype", DTypeError, "must have one dtype"),
])
def test_malformed_operands_raise_a_typed_error_naming_the_op(bad: str, error: type, words: str) -> None:
    q, k, v = _qkv()
    if bad == "key_width":
        k = ember.ones((2, 3, 9, 3))
    elif bad == "value_length":
        v = ember.ones((2, 3, 7, 5))
    else:
        v = v.to(ember.float64)
    with pytest.raises(error, match="scaled_dot_product_attention_out") as info:
        sdpa_out(q, k, v, None, None, scale=0.5)
    assert words in str(info.value)


def test_the_output_is_sdpa_s_first_output_bit_for_bit() -> None:
    q, k, v = _qkv(1)
    mask = ember.tensor(np.tril(np.ones((8, 9), bool)))
    got = sdpa_out(q, k, v, mask, None, scale=0.5).numpy()
    want = sdpa(q, k, v, mask, None, scale=0.5)[0].numpy()
    np.testing.assert_array_equal(got, want)


def test_several_threads_at_once_get_each_their_own_result() -> None:
    cases = [_qkv(seed) for seed in range(8)]
    alone = [sdpa_out(q, k, v, None, None, scale=0.5, is_causal=True).numpy() for q, k, v in cases]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda c: sdpa_out(*c, None, None, scale=0.5, is_causal=True).numpy(), cases * 3))
    for i, got in enumerate(together):
        np.testing.assert_array_equal(got, alone[i % len(cases)])
