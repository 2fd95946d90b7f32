"""The porting API from several threads at once: ember.save/load to separate buffers, ember.device parsing, the
in-place random fills and addcmul_ on one shared device, and backend_extension registrations of distinct ops."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import ember
from ember.extension import TensorSpec, backend_extension, unregister


def _run(work: Callable[[int], None], n: int = 4) -> None:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors


def test_save_and_load_from_threads() -> None:
    def work(i: int) -> None:
        for k in range(20):
            state = {"w": ember.full((3, 4), float(i * 100 + k)), "step": k, "name": f"t{i}"}
            buf = io.BytesIO()
            ember.save(state, buf)
            buf.seek(0)
            back = ember.load(buf)
            assert back["step"] == k and back["name"] == f"t{i}"
            np.testing.assert_array_equal(back["w"].numpy(), np.full((3, 4), i * 100 + k, np.float32))

    _run(work)


def test_device_parsing_from_threads_gives_the_interned_device() -> None:
    seen: list[Any] = []

    def work(i: int) -> None:
        for _ in range(200):
            seen.append(ember.device("cpu+autodiff"))

    _run(work)
    assert len({id(d) for d in seen}) == 1 and len(seen) == 800


def test_fills_and_addcmul_on_one_device_from_threads() -> None:
    dev = ember.Device.parse("flex")

    def work(i: int) -> None:
        for _ in range(50):
            x = ember.zeros(1000, device=dev).uniform_(2.0, 3.0)
            v = x.numpy()
            assert v.min() >= 2.0 and v.max() < 3.0
            y = ember.ones(1000, device=dev).addcmul_(x, x, value=0.5)
            np.testing.assert_allclose(y.numpy(), 1 + 0.5 * v * v, rtol=1e-6)

    _run(work)


def test_registering_distinct_extension_ops_from_threads() -> None:
    names = [f"ext_thread_{i}.double" for i in range(4)]

    def work(i: int) -> None:
        op = backend_extension(names[i], output=lambda x: TensorSpec(x.shape, x.dtype))(
            (lambda k: lambda x: x * (k + 2))(i))
        for _ in range(20):
            np.testing.assert_array_equal(op(ember.ones(3)).numpy(), np.full(3, i + 2, np.float32))

    try:
        _run(work)
        assert all(ember.extension.get(n) is not None for n in names)
    finally:
        for n in names:
            if ember.extension.get(n) is not None:
                unregister(n)
