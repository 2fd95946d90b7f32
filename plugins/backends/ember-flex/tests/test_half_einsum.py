"""flex's einsum on half-precision operands: accumulated in float32 and rounded once, as PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("equation,shapes", [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
                                             ("i,i->", [(7,), (7,)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)])])
def test_half_einsum_matches_torch(dtype: str, equation: str, shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    dev = ember.Device.flex()
    got = ember.einsum(equation, *[ember.tensor(a, device=dev).to(dtype) for a in arrays])
    want = torch.einsum(equation, *[torch.tensor(a).to(getattr(torch, dtype)) for a in arrays])
    assert got.dtype == getattr(ember, dtype)
    np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=2e-2, atol=2e-2)
