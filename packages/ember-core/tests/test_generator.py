"""``ember.Generator``: PyTorch's API (manual_seed, seed, initial_seed, get_state/set_state, device), reproducible
and independent streams, the checks every ``generator=`` argument gets, the default host stream a backend without
its own inherits (``Backend.new_random_stream``), and threads sharing one generator."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
from ember.backend import Backend
from ember.generator import DEFAULT_SEED, HostRandomStream, RandomStream

torch = pytest.importorskip("torch")

DEVICES = ["flex", "flex+autodiff", "flex+fusion(False)", "toy"]


def _device(name: str) -> ember.Device:
    try:
        return ember.Device.parse(name)
    except (ember.PluginError, ember.DeviceError) as e:  # toy is the example backend of the repository's tests
        pytest.skip(f"device {name} is not installed here: {e}")


@pytest.fixture(params=DEVICES)
def dev(request: pytest.FixtureRequest) -> ember.Device:
    return _device(request.param)


def _np(t: ember.Tensor) -> np.ndarray:
    return np.asarray(t.detach().numpy())


# every op that takes generator=, as (name, call(device, generator) -> Tensor)
DRAWS: list[tuple[str, Callable[[ember.Device, Any], ember.Tensor]]] = [
    ("rand", lambda d, g: ember.rand(2, 3, generator=g, device=d)),
    ("randn", lambda d, g: ember.randn((4,), generator=g, device=d)),
    ("randint", lambda d, g: ember.randint(-5, 5, (6,), generator=g, device=d)),
    ("randperm", lambda d, g: ember.randperm(7, generator=g, device=d)),
    ("uniform_", lambda d, g: ember.zeros(5, device=d).uniform_(-1, 2, generator=g)),
    ("normal_", lambda d, g: ember.zeros(5, device=d).normal_(1.0, 2.0, generator=g)),
    ("log_normal_", lambda d, g: ember.zeros(5, device=d).log_normal_(generator=g)),
    ("exponential_", lambda d, g: ember.zeros(5, device=d).exponential_(2.0, generator=g)),
    ("cauchy_", lambda d, g: ember.zeros(5, device=d).cauchy_(generator=g)),
    ("bernoulli_", lambda d, g: ember.zeros(5, device=d).bernoulli_(0.4, generator=g)),
    ("geometric_", lambda d, g: ember.zeros(5, device=d).geometric_(0.3, generator=g)),
    ("random_", lambda d, g: ember.zeros(5, device=d).random_(0, 100, generator=g)),
    ("bernoulli", lambda d, g: ember.bernoulli(ember.full((5,), 0.5, device=d), generator=g)),
    ("normal", lambda d, g: ember.normal(ember.zeros(5, device=d), 1.0, generator=g)),
    ("poisson", lambda d, g: ember.poisson(ember.full((5,), 3.0, device=d), generator=g)),
    ("multinomial", lambda d, g: ember.multinomial(ember.ones(2, 6, device=d), 3, generator=g)),
]
DRAW_IDS = [n for n, _ in DRAWS]


# -- PyTorch's API --------------------------------------------------------------------------------------------------
def test_a_new_generator_starts_from_torchs_default_seed() -> None:
    g = ember.Generator()
    assert g.initial_seed() == DEFAULT_SEED == torch.Generator().initial_seed()
    assert g.device is ember.default_device()
    assert "initial_seed=67280421310721" in repr(g) and "0x" not in repr(g)


@pytest.mark.parametrize("seed", [0, 5, 2**63 - 1, 2**64 - 1, -1, -(2**63)])
def test_manual_seed_returns_the_generator_and_wraps_like_torch(seed: int) -> None:
    g = ember.Generator()
    assert g.manual_seed(seed) is g
    assert g.initial_seed() == torch.Generator().manual_seed(seed).initial_seed()


@pytest.mark.parametrize("bad", [1.5, "3", None, True])
def test_manual_seed_refuses_what_is_not_an_int(bad: Any) -> None:
    with pytest.raises(ember.EmberError, match="Generator.manual_seed"):
        ember.Generator().manual_seed(bad)
    with pytest.raises((RuntimeError, TypeError)):  # torch refuses them too
        torch.Generator().manual_seed(bad)


@pytest.mark.parametrize("bad", [2**64, -(2**63) - 1])
def test_manual_seed_refuses_out_of_range(bad: int) -> None:
    with pytest.raises(ember.DeviceError, match="out of range"):
        ember.Generator().manual_seed(bad)
    with pytest.raises((RuntimeError, ValueError)):
        torch.Generator().manual_seed(bad)


def test_seed_draws_a_fresh_seed_and_restarts_from_it() -> None:
    g = ember.Generator()
    s = g.seed()
    assert isinstance(s, int) and 0 <= s < 2**63 and g.initial_seed() == s
    a = _np(ember.rand(4, generator=g))
    assert np.array_equal(a, _np(ember.rand(4, generator=ember.Generator().manual_seed(s))))
    assert ember.Generator().seed() != s  # 63 random bits


def test_device_is_the_one_given(dev: ember.Device) -> None:
    assert ember.Generator(dev).device is dev
    assert ember.Generator(str(dev)).device is dev


# -- reproducible and independent -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,call", DRAWS, ids=DRAW_IDS)
def test_same_seed_same_draws(dev: ember.Device, name: str, call: Callable[[ember.Device, Any], ember.Tensor]) -> None:
    g1, g2 = ember.Generator(dev).manual_seed(11), ember.Generator(dev).manual_seed(11)
    a1, b1 = _np(call(dev, g1)), _np(call(dev, g1))
    a2, b2 = _np(call(dev, g2)), _np(call(dev, g2))
    assert np.array_equal(a1, a2) and np.array_equal(b1, b2)
    if name not in ("bernoulli_", "bernoulli", "multinomial"):  # few outcomes: two draws may agree by chance
        assert not np.array_equal(a1, b1)  # the stream moves on


@pytest.mark.parametrize("name,call", DRAWS, ids=DRAW_IDS)
def test_generator_draws_never_move_the_device_stream(dev: ember.Device, name: str,
                                                      call: Callable[[ember.Device, Any], ember.Tensor]) -> None:
    ember.manual_seed(3)
    expected = _np(ember.rand(8, device=dev))
    ember.manual_seed(3)
    g = ember.Generator(dev).manual_seed(1)
    call(dev, g)
    assert np.array_equal(_np(ember.rand(8, device=dev)), expected)


def test_device_draws_never_move_a_generator(dev: ember.Device) -> None:
    expected = _np(ember.randn(8, generator=ember.Generator(dev).manual_seed(4), device=dev))
    g = ember.Generator(dev).manual_seed(4)
    ember.randn(100, device=dev)
    ember.manual_seed(9)
    other = ember.Generator(dev).manual_seed(4)
    ember.randn(5, generator=other, device=dev)  # another generator with the same seed is its own stream
    assert np.array_equal(_np(ember.randn(8, generator=g, device=dev)), expected)


def test_different_seeds_differ() -> None:
    a = _np(ember.rand(16, generator=ember.Generator().manual_seed(1)))
    b = _np(ember.rand(16, generator=ember.Generator().manual_seed(2)))
    assert not np.array_equal(a, b)


def test_one_generator_serves_every_decoration_of_a_device() -> None:
    flex, ad = _device("flex"), _device("flex+autodiff")
    a = _np(ember.rand(5, generator=ember.Generator(flex).manual_seed(8), device=ad))
    b = _np(ember.rand(5, generator=ember.Generator(ad).manual_seed(8), device=flex))
    assert np.array_equal(a, b)
    t = ember.rand(3, generator=ember.Generator(flex), device=ad, requires_grad=True)
    assert t.requires_grad and t.device is ad


def test_a_flex_generator_repeats_the_flex_stream() -> None:
    """flex draws its generators natively from the same PCG64 as its device stream."""
    flex = _device("flex")
    flex.seed(21)
    expected = [_np(ember.rand(6, device=flex)), _np(ember.randn(6, device=flex)),
                _np(ember.randint(0, 9, (6,), device=flex))]
    g = ember.Generator(flex).manual_seed(21)
    got = [_np(ember.rand(6, generator=g, device=flex)), _np(ember.randn(6, generator=g, device=flex)),
           _np(ember.randint(0, 9, (6,), generator=g, device=flex))]
    for e, x in zip(expected, got):
        assert np.array_equal(e, x)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_float_dtypes(dtype: str) -> None:
    g = ember.Generator()
    x = ember.rand(1000, generator=g, dtype=dtype)
    assert x.dtype is ember.dtypes.as_dtype(dtype)
    v = _np(x.to("float64"))
    assert 0 <= v.min() and v.max() <= 1 and 0.4 < v.mean() < 0.6
    y = ember.randn(1000, generator=g, dtype=dtype)
    assert y.dtype is ember.dtypes.as_dtype(dtype) and abs(float(_np(y.to("float64")).mean())) < 0.2


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "bool", "float32"])
def test_randint_dtypes(dtype: str) -> None:
    hi = 2 if dtype == "bool" else 100
    x = ember.randint(0, hi, (500,), generator=ember.Generator().manual_seed(0), dtype=dtype)
    assert x.dtype is ember.dtypes.as_dtype(dtype)
    v = _np(x).astype(np.int64)
    assert v.min() >= 0 and v.max() < hi and len(set(v.tolist())) == hi


def test_randperm_is_a_permutation() -> None:
    p = _np(ember.randperm(50, generator=ember.Generator().manual_seed(1)))
    assert sorted(p.tolist()) == list(range(50)) and p.tolist() != list(range(50))
    assert ember.randperm(0, generator=ember.Generator()).shape == (0,)


# -- state ----------------------------------------------------------------------------------------------------------
def test_state_round_trips(dev: ember.Device) -> None:
    g = ember.Generator(dev).manual_seed(123)
    ember.rand(10, generator=g, device=dev)
    state = g.get_state()
    assert state.dtype is ember.uint8 and state.ndim == 1 and state.device is ember.Device.host()
    a = _np(ember.randn(7, generator=g, device=dev))
    assert g.set_state(state) is g
    assert np.array_equal(_np(ember.randn(7, generator=g, device=dev)), a)
    other = ember.Generator(dev).set_state(state)  # another generator continues from the same point
    assert other.initial_seed() == 123
    assert np.array_equal(_np(ember.randn(7, generator=other, device=dev)), a)
    assert np.array_equal(_np(g.get_state()), _np(other.get_state()))


def test_get_state_is_a_copy() -> None:
    g = ember.Generator()
    s = g.get_state()
    before = _np(s).copy()
    ember.rand(100, generator=g)
    assert np.array_equal(_np(s), before)


def test_pickle_keeps_the_state() -> None:
    g = ember.Generator().manual_seed(5)
    ember.rand(3, generator=g)
    h = pickle.loads(pickle.dumps(g))
    assert h.initial_seed() == 5 and h.device is g.device
    assert np.array_equal(_np(ember.rand(4, generator=g)), _np(ember.rand(4, generator=h)))


@pytest.mark.parametrize("bad", [lambda: ember.zeros(3), lambda: ember.zeros(2, 2, dtype="uint8"), lambda: b"x",
                                 lambda: [1, 2]], ids=["float", "2d", "bytes", "list"])
def test_set_state_refuses_what_is_not_a_byte_tensor(bad: Callable[[], Any]) -> None:
    with pytest.raises(ember.DTypeError, match="Generator.set_state: the state must be a 1-d uint8 tensor"):
        ember.Generator().set_state(bad())
    with pytest.raises(TypeError):  # torch: "RNG state must be a torch.ByteTensor"
        torch.Generator().set_state(torch.zeros(3))


@pytest.mark.parametrize("mangle", [lambda b: b[:5], lambda b: b[:-10], lambda b: b"XXXXXXXX" + b[8:],
                                    lambda b: b[:-3] + b"}}}"], ids=["short", "truncated", "magic", "payload"])
def test_set_state_refuses_bytes_that_are_no_state(mangle: Callable[[bytes], bytes]) -> None:
    g = ember.Generator().manual_seed(1)
    blob = mangle(bytes(_np(g.get_state())))
    with pytest.raises(ember.ValueRangeError, match="Generator.set_state"):
        g.set_state(ember.from_numpy(np.frombuffer(blob, dtype=np.uint8).copy()))
    assert np.array_equal(_np(ember.rand(3, generator=g)),  # a refused state leaves the generator as it was
                          _np(ember.rand(3, generator=ember.Generator().manual_seed(1))))


def test_set_state_refuses_another_backends_state() -> None:
    toy = _device("toy")
    with pytest.raises(ember.ValueRangeError, match="'toy' generator.*draws on 'flex'"):
        ember.Generator("flex").set_state(ember.Generator(toy).get_state())


# -- generator= checks ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,call", DRAWS, ids=DRAW_IDS)
@pytest.mark.parametrize("bad", [lambda: torch.Generator(), lambda: object(), lambda: 7],
                         ids=["torch", "object", "int"])
def test_generator_must_be_an_ember_generator(name: str, call: Callable[[ember.Device, Any], ember.Tensor],
                                              bad: Callable[[], Any]) -> None:
    with pytest.raises(ember.UnsupportedError, match="generator objects are not supported unless they are an "
                                                     "ember.Generator"):
        call(_device("flex"), bad())


@pytest.mark.parametrize("name,call", DRAWS, ids=DRAW_IDS)
def test_a_generator_of_another_device_is_refused(name: str, call: Callable[[ember.Device, Any], ember.Tensor]) -> None:
    flex, toy = _device("flex"), _device("toy")
    with pytest.raises(ember.DeviceError, match="generator draws on device toy, but the op draws on device flex"):
        call(flex, ember.Generator(toy))
    with pytest.raises(RuntimeError):  # torch too: a CUDA generator is refused for CPU tensors (meta stands in)
        torch.rand(2, generator=torch.Generator("meta"))


def test_none_is_the_device_stream() -> None:
    ember.manual_seed(2)
    a = _np(ember.rand(5, generator=None))
    ember.manual_seed(2)
    assert np.array_equal(a, _np(ember.rand(5)))


# -- the backend side -----------------------------------------------------------------------------------------------
def test_a_backend_without_its_own_stream_gets_the_host_default() -> None:
    """toy implements the required primitives only: its generators draw on the host (Philox) and upload."""
    toy = _device("toy")
    backend = toy.stack.base_backend
    assert type(backend).new_random_stream is Backend.new_random_stream
    stream = backend.new_random_stream(5)
    assert isinstance(stream, HostRandomStream) and isinstance(stream, RandomStream)
    assert type(stream.rng.bit_generator).__name__ == "Philox"
    expected = np.random.Generator(np.random.Philox(5)).random((3,), dtype=np.float32)
    assert np.array_equal(_np(ember.rand(3, generator=ember.Generator(toy).manual_seed(5), device=toy)), expected)


def test_a_stream_without_the_protocol_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    toy = _device("toy")
    monkeypatch.setattr(type(toy.stack.base_backend), "new_random_stream", lambda self, seed: object(),
                        raising=False)
    with pytest.raises(ember.UnsupportedError, match="without rand, randn, randint, get_state, set_state"):
        ember.Generator(toy)


def test_host_stream_state_round_trips_for_numpy_bit_generators() -> None:
    backend = _device("flex").stack.base_backend
    for bits in (np.random.Philox(3), np.random.PCG64(3), np.random.SFC64(3)):
        s = HostRandomStream(backend, bits)
        s.rand((5,), ember.float32)
        state = s.get_state()
        a = np.asarray(s.randn((4,), ember.float64))
        s.set_state(state)
        assert np.array_equal(np.asarray(s.randn((4,), ember.float64)), a)
    with pytest.raises(ember.ValueRangeError, match="a PCG64 state, this stream is Philox"):
        HostRandomStream(backend, np.random.Philox(0)).set_state(HostRandomStream(backend, np.random.PCG64(0))
                                                                 .get_state())


# -- threads --------------------------------------------------------------------------------------------------------
def test_two_threads_share_one_generator() -> None:
    """Each draw holds the generator's lock: two threads get whole, distinct chunks of one sequence, so together
    they draw exactly the chunks one thread would have drawn, in some interleaving."""
    n_each, size = 150, 32
    g = ember.Generator().manual_seed(77)
    chunks: list[list[tuple[float, ...]]] = [[], []]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(n_each):
                chunks[i].append(tuple(_np(ember.rand(size, generator=g)).tolist()))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ref = ember.Generator().manual_seed(77)
    expected = sorted(tuple(_np(ember.rand(size, generator=ref)).tolist()) for _ in range(2 * n_each))
    assert sorted(chunks[0] + chunks[1]) == expected
    assert len(chunks[0]) == len(chunks[1]) == n_each
