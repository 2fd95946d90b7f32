"""ember-remote over real sockets on 127.0.0.1: results equal flex, graph replay, security refusals, limits,
lost connections, and a fuzzer of malformed frames (the server stays up and still serves a valid client)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import Device
from ember.errors import DeviceError, OutOfMemoryError
from ember_remote.executor import Limits
from ember_remote.protocol import VERSION, RemoteError, pack_frame
from ember_remote.server import Server, fingerprint_of, server_ssl_context, write_self_signed

FLEX = Device.parse("flex")


class Running:
    """A server on its own event loop in a daemon thread."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        assert started.wait(30)

    @property
    def port(self) -> int:
        return self.server.port

    def sessions(self) -> int:
        return len(self.server._sessions)

    def stop(self) -> None:
        async def close() -> None:
            self.server.stop()
            await self.server._shutdown()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    paths = write_self_signed(tmp_path_factory.mktemp("pki"))
    return {**paths, "token_text": paths["token"].read_text().strip(), "fp": fingerprint_of(paths["cert"])}


@pytest.fixture(scope="module")
def tls(pki: dict[str, Any]) -> Iterator[Running]:
    r = Running(Server(FLEX, pki["token_text"], port=0, ssl_context=server_ssl_context(pki["cert"], pki["key"]),
                       limits=Limits(max_bytes=64 << 20, max_tensors=1000)))
    yield r
    r.stop()


def _remote(r: Running, pki: dict[str, Any], **kw: Any) -> Device:
    opts = {"token": pki["token_text"], "fingerprint": pki["fp"], **kw}
    return Device.remote(f"ember://127.0.0.1:{r.port}/flex", **opts)


@pytest.fixture(scope="module")
def dev(tls: Running, pki: dict[str, Any]) -> Device:
    return _remote(tls, pki)


def _both(fn: Any, dev: Device) -> tuple[Any, Any]:
    return fn(dev), fn(FLEX)


# -- results ---------------------------------------------------------------------------------------------------
CASES = {
    "arith": lambda d: ((ember.arange(12.0, device=d).reshape(3, 4) * 3 + 1) / 2).exp().sum(dim=1),
    "matmul": lambda d: ember.tensor(np.arange(12.0).reshape(3, 4), device=d)
    @ ember.tensor(np.arange(8.0).reshape(4, 2), device=d),
    "int_ops": lambda d: (ember.arange(10, device=d) % 3) * ember.arange(10, device=d),
    "compare_where": lambda d: ember.where(ember.arange(6.0, device=d) > 2, ember.ones(6, device=d),
                                          ember.zeros(6, device=d)),
    "indexing": lambda d: ember.arange(24.0, device=d).reshape(2, 3, 4)[1, :, 1:3].permute(1, 0),
    "setitem": lambda d: _setitem(d),
    "sort": lambda d: ember.sort(ember.tensor([3.0, 1.0, 2.0, -1.0], device=d)).values,
    "topk_indices": lambda d: ember.topk(ember.tensor([3.0, 1.0, 2.0, 5.0], device=d), 2).indices,
    "softmax": lambda d: F.softmax(ember.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], device=d), dim=-1),
    "cumsum_cat": lambda d: ember.cat([ember.arange(3.0, device=d).cumsum(0), ember.ones(2, device=d)]),
    "float16": lambda d: (ember.arange(5.0, device=d).to(ember.float16) * 1.5).to(ember.float32),
    "bool_reduce": lambda d: (ember.arange(5, device=d) > 2).any(),
    "scalar_0d": lambda d: ember.tensor(3.0, device=d) * ember.tensor([1.0, 2.0], device=d).sum(),
    "bfloat16_roundtrip": lambda d: ember.tensor([1.5, -2.25, 3.0], device=d, dtype=ember.bfloat16) * 2,
    "complex": lambda d: ember.tensor([1 + 2j, 3 - 1j], device=d) * ember.tensor([2j, 1.0], device=d),
}


def _setitem(d: Device) -> ember.Tensor:
    x = ember.zeros(3, 4, device=d)
    x[1] = ember.arange(4.0, device=d)
    x[:, 2] += 5
    return x


@pytest.mark.parametrize("case", sorted(CASES))
def test_results_equal_flex(dev: Device, case: str) -> None:
    got, want = _both(CASES[case], dev)
    assert got.device == dev and want.device == FLEX
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_moves_between_remote_and_local(dev: Device) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = ember.tensor(a, device=FLEX).to(dev)
    assert x.device == dev
    back = (x * 2).to(FLEX)
    assert back.device == FLEX
    np.testing.assert_array_equal(back.numpy(), a * 2)
    np.testing.assert_array_equal(x.cpu().numpy(), a)


def test_random_and_seed_match_flex(dev: Device) -> None:
    ember.manual_seed(7)
    a = ember.randn(3, 4, device=dev).numpy()
    ember.manual_seed(7)
    b = ember.randn(3, 4, device=FLEX).numpy()
    np.testing.assert_array_equal(a, b)


def test_sessions_have_their_own_random_streams(tls: Running, pki: dict[str, Any], dev: Device) -> None:
    other = _remote(tls, pki, timeout=60.0)  # a second session (other options, so another device)
    dev.seed(11)
    first = ember.rand(4, device=dev).numpy()
    other.seed(12)
    ember.rand(100, device=other).numpy()  # draws between the first session's draws
    second = ember.randn(3, device=dev).numpy()
    FLEX.seed(11)
    np.testing.assert_array_equal(first, ember.rand(4, device=FLEX).numpy())
    np.testing.assert_array_equal(second, ember.randn(3, device=FLEX).numpy())


def test_generator_streams_live_on_the_server_and_match_flex(dev: Device) -> None:
    def draws(d: Device) -> list[np.ndarray]:
        g = ember.Generator(d).manual_seed(5)
        a = ember.rand(3, 2, generator=g, device=d).numpy()
        state = g.get_state()
        b = ember.randn(4, generator=g, device=d).numpy()
        g.set_state(state)
        c = ember.randn(4, generator=g, device=d).numpy()
        return [a, b, c, ember.randint(0, 9, (5,), generator=g, device=d).numpy()]

    got, want = draws(dev), draws(FLEX)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(got[1], got[2])


def test_graph_replay_registers_once(dev: Device) -> None:
    x = ember.ones(5, device=dev)
    x.numpy()
    before = dev.memory_report()
    out = [round((x * k).exp().sum().item(), 3) for k in (1.0, 2.0, 3.0)]
    after = dev.memory_report()
    assert out == [13.591, 36.945, 100.428]
    assert after["remote_graphs_registered"] - before["remote_graphs_registered"] == 1
    assert after["remote_graph_hits"] - before["remote_graph_hits"] == 2
    # one round trip per read (the graph travels with the download), plus the memory_report itself
    assert after["remote_round_trips"] - before["remote_round_trips"] == 4


def test_autodiff_over_remote_matches_torch(dev: Device) -> None:
    torch = pytest.importorskip("torch")
    ad = dev.autodiff()
    x = ember.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], device=ad, requires_grad=True)
    w = ember.tensor([[1.0], [2.0], [-1.0]], device=ad, requires_grad=True)
    loss = ((x @ w).tanh() ** 2).sum()
    loss.backward()
    tx = torch.tensor(x.detach().numpy(), requires_grad=True, dtype=torch.float32)
    tw = torch.tensor(w.detach().numpy(), requires_grad=True, dtype=torch.float32)
    tl = ((tx @ tw).tanh() ** 2).sum()
    tl.backward()
    np.testing.assert_allclose(loss.item(), tl.item(), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_seed_cnn_training_equals_local_bit_for_bit_and_replays(dev: Device) -> None:
    """Four SGD steps of the seed CNN give the local losses and parameters bit for bit: the server runs flex's own
    kernels for cross-entropy, batch norm and GELU, and the autodiff stack here uses the server's convolution
    gradient kernels (offered in the hello), as flex+autodiff does locally -- without them it differentiated the
    convolution by its composition, whose sums round differently (about 1e-7 after the first step). From the third
    step on, a step registers no graph and sends about the input batch plus a few hundred bytes."""
    models = pytest.importorskip("ember_train.models")
    counts = dev.stack.counts
    assert callable(getattr(dev.stack, "conv_weight_grad", None)) and callable(dev.stack.conv_input_grad)
    params: dict[str, list[np.ndarray]] = {}

    def train(d: Device) -> tuple[list[float], list[dict[str, int]]]:
        ember.manual_seed(0)
        m = models.seed_cnn(dropout=0.0).to(d)
        opt = ember.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        rng = np.random.default_rng(0)
        losses, deltas = [], []
        for _ in range(4):
            before = dict(counts)
            x = ember.tensor(rng.standard_normal((4, 1, 28, 28)).astype(np.float32), device=d)
            y = ember.tensor(rng.integers(0, 10, 4), device=d)
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            deltas.append({k: counts[k] - before[k] for k in counts})
        params[str(d)] = [p.detach().numpy().copy() for p in m.parameters()]
        return losses, deltas

    remote_losses, deltas = train(dev.autodiff())
    local_losses, _ = train(FLEX.autodiff())
    assert [np.float32(v).tobytes() for v in remote_losses] == [np.float32(v).tobytes() for v in local_losses]
    remote_params, local_params = params[str(dev.autodiff())], params[str(FLEX.autodiff())]
    assert all(np.array_equal(a, b) for a, b in zip(remote_params, local_params, strict=True))
    assert deltas[2]["graphs_registered"] == 0 and deltas[2]["graph_hits"] >= 1
    assert deltas[2]["bytes_sent"] < 4 * 784 * 4 + 4096


def test_layout_checks_use_the_servers_strides(dev: Device) -> None:
    """view() of a non-viewable layout and writes into a broadcast view are refused at the call, as on flex: the
    client asks the server for a tensor's strides when core checks them (once per handle)."""
    from ember.errors import ShapeError, UnsupportedError

    for d in (dev, FLEX):
        t = ember.arange(24.0, device=d).reshape(2, 3, 4).transpose(1, 2)
        with pytest.raises(ShapeError, match="not compatible with input tensor's size"):
            t.view(2, 12)
        np.testing.assert_array_equal(t.view(2, 2, 2, 3).numpy(), np.arange(24.0).reshape(2, 3, 4)
                                      .transpose(0, 2, 1).reshape(2, 2, 2, 3))
        e = ember.zeros(3, device=d).expand(2, 3)
        with pytest.raises(UnsupportedError, match="refers to a single memory location"):
            e[0, 0] = 1.0
        assert e.numpy().sum() == 0  # nothing was written (nor left pending to fail later)
    x = ember.arange(6.0, device=dev).reshape(2, 3)
    before = dev.memory_report()
    assert x._h.strides == x._h.strides == (12, 4)  # float32 bytes, as flex's numpy arrays
    after = dev.memory_report()
    assert after["remote_strides_asked"] - before["remote_strides_asked"] == 1
    assert after["remote_round_trips"] - before["remote_round_trips"] == 2  # the question and this report


def test_several_devices_per_server_the_path_picks_one(pki: dict[str, Any]) -> None:
    unfused = Device.parse("flex+fusion(False)")
    r = Running(Server({"flex": FLEX, "flex+fusion(False)": unfused}, pki["token_text"], port=0,
                       ssl_context=server_ssl_context(pki["cert"], pki["key"])))
    try:
        url = f"ember://127.0.0.1:{r.port}"
        for path, served in (("/flex", FLEX), ("/flex+fusion(False)", unfused),
                             ("/flex+fusion(enabled=False)", unfused), ("", FLEX)):
            d = Device.remote(url + path, token=pki["token_text"], fingerprint=pki["fp"], timeout=30.0)
            assert d.stack.served == str(served)
            assert (ember.arange(4.0, device=d) * 2).tolist() == [0.0, 2.0, 4.0, 6.0]
        with pytest.raises(DeviceError, match=r"does not serve 'toy'.*it serves \['flex', 'flex\+fusion"):
            _ = Device.remote(url + "/toy", token=pki["token_text"], fingerprint=pki["fp"], timeout=30.0).stack
        assert r.server.stats["refused"] == 1
    finally:
        r.stop()


def test_to_between_two_devices_of_one_server_moves_on_the_server(pki: dict[str, Any], tls: Running) -> None:
    """.to() between remote devices of one server: exported by one session, imported by the other (no download,
    no upload through the client); to another server's device, or to flex, through the host as before."""
    r = Running(Server({"flex": FLEX, "flex+fusion(False)": Device.parse("flex+fusion(False)")}, pki["token_text"],
                       port=0, ssl_context=server_ssl_context(pki["cert"], pki["key"])))
    try:
        url = f"ember://127.0.0.1:{r.port}"
        a = Device.remote(url + "/flex", token=pki["token_text"], fingerprint=pki["fp"], timeout=31.0)
        b = Device.remote(url + "/flex+fusion(False)", token=pki["token_text"], fingerprint=pki["fp"], timeout=31.0)
        a2 = Device.remote(url + "/flex", token=pki["token_text"], fingerprint=pki["fp"], timeout=32.0)  # 2nd session
        want = np.arange(12, dtype=np.float32).reshape(3, 4)
        x = ember.tensor(want, device=a) * 2
        x.numpy()
        before = {d: d.memory_report() for d in (a, b, a2)}
        y = x.to(b)
        z = (y + 1).to(a2)
        x.add_(100.0)  # the moved tensors are their own: a later write to the source does not reach them
        assert y.device == b and z.device == a2
        np.testing.assert_array_equal(y.numpy(), want * 2)
        np.testing.assert_array_equal(z.numpy(), want * 2 + 1)
        after = {d: d.memory_report() for d in (a, b, a2)}
        for d in (a, b, a2):
            delta = {k: after[d][f"remote_{k}"] - before[d][f"remote_{k}"] for k in ("uploads", "downloads")}
            assert delta["uploads"] == 0 and delta["downloads"] <= 1  # the reads above, none for the moves
        assert after[b]["remote_peer_moves"] - before[b]["remote_peer_moves"] == 1
        assert after[a2]["remote_peer_moves"] - before[a2]["remote_peer_moves"] == 1
        other = _remote(tls, pki, timeout=33.0)  # another server: through the host
        np.testing.assert_array_equal(y.to(other).numpy(), want * 2)
        assert other.memory_report()["remote_peer_moves"] == 0
    finally:
        r.stop()


def test_compression_negotiated_and_measured(tls: Running, pki: dict[str, Any]) -> None:
    """compress=True: the hello negotiates zlib, large compressible frames shrink (both ways), values are
    unchanged; incompressible data travels as it is."""
    a = np.tile(np.arange(256, dtype=np.float32), 1024)  # 1 MiB, compressible
    noise = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)  # 256 KiB, barely compressible
    sent = {}
    for compress in (False, True):
        d = _remote(tls, pki, compress=compress, timeout=61.0 + compress)  # distinct options: distinct devices
        assert d.stack._conn.compress == ("zlib" if compress else None)
        before = d.memory_report()
        x = ember.tensor(a, device=d)
        np.testing.assert_array_equal((x + 0).numpy(), a)
        n = ember.tensor(noise, device=d)
        np.testing.assert_array_equal(n.numpy(), noise)
        after = d.memory_report()
        sent[compress] = {k: after[f"remote_{k}"] - before[f"remote_{k}"] for k in ("bytes_sent", "bytes_received")}
    assert sent[False]["bytes_sent"] > a.nbytes + noise.nbytes
    assert sent[True]["bytes_sent"] < a.nbytes // 10 + noise.nbytes + 4096
    # downloads: bytes_received counts payloads as decoded, the frames' compression is below it
    assert sent[True]["bytes_received"] == sent[False]["bytes_received"]


def test_compressed_frames_are_bounded_and_only_after_negotiation() -> None:
    from ember_remote.protocol import ProtocolError, unpack_frame

    inner = msgpack.packb([VERSION, "batch", [["sync"]]], use_bin_type=True)

    def z(payload: bytes) -> bytes:
        return msgpack.packb([VERSION, "z", payload], use_bin_type=True)

    assert unpack_frame(z(zlib.compress(inner)), 1 << 20, compressed=True) == ("batch", [["sync"]])
    with pytest.raises(ProtocolError, match="no compression was negotiated"):
        unpack_frame(z(zlib.compress(inner)), 1 << 20)
    bomb = zlib.compress(b"\x00" * (64 << 20), 9)  # 64 MiB of zeros in ~64 kB
    with pytest.raises(ProtocolError, match="inflates past the limit"):
        unpack_frame(z(bomb), 1 << 20, compressed=True)
    with pytest.raises(ProtocolError, match="truncated"):
        unpack_frame(z(zlib.compress(inner)[:-3]), 1 << 20, compressed=True)
    with pytest.raises(ProtocolError, match="undecodable compressed"):
        unpack_frame(z(b"not zlib at all"), 1 << 20, compressed=True)
    with pytest.raises(ProtocolError, match="inside a compressed frame"):
        unpack_frame(z(zlib.compress(z(zlib.compress(inner)))), 1 << 20, compressed=True)


def test_extension_ops_run_as_one_record_with_the_servers_kernel(dev: Device) -> None:
    x = ember.tensor([[-1.0, 0.5, 2.0], [0.0, 1.0, -3.0]], device=dev)
    before = dev.memory_report()["remote_ops_sent"]
    got = F.gelu(x).numpy()
    assert dev.memory_report()["remote_ops_sent"] - before == 1  # one extension record, not its composition
    np.testing.assert_array_equal(got, F.gelu(ember.tensor(x.numpy(), device=FLEX)).numpy())


def test_numpy_scalars_keep_their_type() -> None:
    from ember_remote.protocol import decode_value, encode_value

    for v in (np.float32(1.5), np.int8(-3), np.float64(2.0), np.bool_(True)):
        back = decode_value(msgpack.unpackb(msgpack.packb(encode_value(v)), raw=False))
        assert type(back) is type(v) and back == v


def test_graph_limit_evicts_the_least_recently_used(pki: dict[str, Any]) -> None:
    r = Running(Server(FLEX, pki["token_text"], port=0, ssl_context=server_ssl_context(pki["cert"], pki["key"]),
                       limits=Limits(max_graphs=3)))
    try:
        d = _remote(r, pki, timeout=30.0)
        x = ember.arange(4.0, device=d)
        ops = [lambda t: t + 1, lambda t: t * 2, lambda t: t.exp(), lambda t: t.sin(), lambda t: t - 3]
        for _ in range(2):
            for f in ops:  # five distinct graphs through a server that keeps three
                np.testing.assert_allclose(f(x).numpy(), f(ember.arange(4.0, device=FLEX)).numpy(), rtol=1e-6)
        assert d.memory_report()["server_graphs"] <= 3
    finally:
        r.stop()


def test_session_memory_limit_is_typed_and_session_survives(dev: Device) -> None:
    with pytest.raises(OutOfMemoryError, match="memory limit"):
        ember.zeros(40 << 20, device=dev, dtype=ember.float32).sum().item()  # 160 MiB > the 64 MiB limit
    assert ember.ones(3, device=dev).sum().item() == 3.0


# -- security ----------------------------------------------------------------------------------------------------
def test_wrong_token_is_refused_and_nothing_runs(tls: Running, pki: dict[str, Any]) -> None:
    accepted, failed = tls.server.stats["accepted"], tls.server.stats["auth_failed"]
    with pytest.raises(DeviceError, match="token is wrong"):
        _ = Device.remote(f"ember://127.0.0.1:{tls.port}/flex", token="x" * 64, fingerprint=pki["fp"]).stack
    assert tls.server.stats["accepted"] == accepted and tls.server.stats["auth_failed"] == failed + 1


def test_wrong_fingerprint_is_refused_before_the_token_is_sent(tls: Running, pki: dict[str, Any]) -> None:
    accepted = tls.server.stats["accepted"]
    with pytest.raises(DeviceError, match="pinned fingerprint"):
        _ = Device.remote(f"ember://127.0.0.1:{tls.port}/flex", token=pki["token_text"], fingerprint="ab" * 32).stack
    assert tls.server.stats["accepted"] == accepted


def test_plaintext_client_against_tls_server_is_refused(tls: Running, pki: dict[str, Any]) -> None:
    accepted = tls.server.stats["accepted"]
    with pytest.raises(DeviceError, match="connection"):
        _ = Device.remote(f"ember://127.0.0.1:{tls.port}/flex", token=pki["token_text"], insecure=True).stack
    # a raw plaintext hello followed by a batch: the TLS layer drops the peer, no op runs
    with socket.create_connection(("127.0.0.1", tls.port), timeout=10) as s:
        s.sendall(pack_frame("hello", {"token": pki["token_text"]}) + pack_frame("batch", [["sync"]]))
        data = _drain(s)
    assert b"\xa2ok" not in data and tls.server.stats["accepted"] == accepted  # no "ok" frame came back


def test_insecure_only_on_loopback() -> None:
    from ember.errors import ValueRangeError

    with pytest.raises(ValueRangeError, match="loopback"):
        Server(FLEX, "t" * 32, host="0.0.0.0", ssl_context=None)  # noqa: S104 - the refusal under test
    with pytest.raises(DeviceError, match="loopback hosts only"):  # core wraps the factory's error
        _ = Device.remote("ember://10.1.2.3:7433/flex", token="t" * 32, insecure=True).stack


def test_max_sessions_and_killed_client_frees_its_session(pki: dict[str, Any]) -> None:
    r = Running(Server(FLEX, pki["token_text"], port=0, ssl_context=server_ssl_context(pki["cert"], pki["key"]),
                       max_sessions=1))
    try:
        d1 = _remote(r, pki)
        ember.ones(1000, device=d1).sum().item()
        assert r.sessions() == 1
        with pytest.raises(DeviceError, match="no free session"):
            _ = _remote(r, pki, timeout=10.0).stack
        d1.stack._conn.sock.close()  # the client dies without a goodbye
        _wait(lambda: r.sessions() == 0)
        d2 = _remote(r, pki, timeout=30.0)
        assert ember.ones(4, device=d2).sum().item() == 4.0
    finally:
        r.stop()


def test_stop_finishes_the_batch_in_flight(pki: dict[str, Any]) -> None:
    r = Running(Server(FLEX, pki["token_text"], port=0, ssl_context=server_ssl_context(pki["cert"], pki["key"])))
    d = _remote(r, pki, timeout=60.0)
    x = ember.ones(1200, 1200, device=d, dtype=ember.float64)
    x.sum().item()
    result: list[Any] = []

    def work() -> None:
        y = x
        for _ in range(6):
            y = (y @ x) / 1200.0
        result.append(y.sum().item())

    t = threading.Thread(target=work)
    t.start()
    _wait(lambda: any(s["busy"] for s in list(r.server._sessions.values())), 30)
    r.stop()  # stops while the batch runs: its reply still arrives
    t.join(60)
    assert result == [1200.0 * 1200.0]


def test_idle_timeout_then_reconnect_with_typed_lost_state(pki: dict[str, Any]) -> None:
    r = Running(Server(FLEX, pki["token_text"], port=0, ssl_context=server_ssl_context(pki["cert"], pki["key"]),
                       idle_timeout=0.3))
    try:
        d = _remote(r, pki, timeout=20.0)
        x = ember.arange(4.0, device=d)
        assert x.sum().item() == 6.0
        _wait(lambda: r.sessions() == 0)
        with pytest.raises(RemoteError, match="connection was lost"):
            x.sum().item()
        with pytest.raises(RemoteError, match="session that was lost"):
            x.sum().item()
        assert ember.arange(3.0, device=d).sum().item() == 3.0  # a new session
        assert d.memory_report()["remote_reconnects"] == 1
    finally:
        r.stop()


# -- malformed frames ------------------------------------------------------------------------------------------
def _drain(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (OSError, TimeoutError):
        pass
    return out


def _wait(cond: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.02)


def _frame(obj: Any) -> bytes:
    data = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


_BOMB = zlib.compress(b"\x00" * (8 << 20), 9)  # 8 MiB of zeros in 8 kB


def _malformed_messages(rng: random.Random) -> Iterator[Any]:
    """Bodies of batch frames that decode but must be refused (messages of wrong shapes, types and ids)."""
    vals: list[Any] = [None, True, -1, 0, 2**63 - 1, -(2**63), 1.5, float("nan"), "x", b"\x00" * 3, [], {}, [[]],
                       {"r": 1}, {"d": "float99"}, {"p": ["dim", 10**9]}, {"x": [1, 2, 3]}, {"o": [1, [2], "int8"]},
                       ["float32", [2, 2], b"\x00" * 15], ["float32", [-1], b""], ["float32", [2**31, 2**31], b""],
                       [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
    kinds = ["register", "replay", "upload", "download", "release", "call", "seed", "sync", "stats", "bogus",
             "strides", "export", "import", "forget"]
    while True:
        kind = rng.choice(kinds)
        yield [[kind, *[rng.choice(vals) for _ in range(rng.randrange(0, 6))]]]


def _graph_attacks() -> list[Any]:
    """Registered graphs that try to reach past the protocol: unknown methods, out-of-range positions."""
    dt = {"d": "float32"}
    return [
        [["register", 1, [[], [["__class__", [], [], [], []]], []]]],
        [["register", 1, [[], [["to_numpy", [], [], [], []]], []]]],
        [["register", 1, [[[[3], dt]], [["unary", [["in", 5]], [[3]], [dt], ["exp", {"r": 0}]]], [["v", 0]]]]],
        [["register", 1, [[[[3], dt]], [["unary", [["in", 0]], [[3]], [dt], ["exp", {"r": 7}]]], [["v", 3]]]]],
        [["replay", 99, [1], [2], [[], []], []]],
        [["call", "memory_dry_run", [], []]],
        [["call", "new_random_stream", [], [1]]],
        [["download", 12345]],
        [["upload", 5, ["float32", [1000000, 1000000], b""]]],
        [["import", 3, b"\x00" * 16]],  # a ticket nobody exported
        [["export", 12345, b"\x01" * 16]],  # a tensor the session does not hold
        [["strides", 777]],
    ]


def test_fuzzer_malformed_frames_server_stays_up(pki: dict[str, Any]) -> None:
    """Malformed frames on authenticated and unauthenticated connections; after each kind the server still
    answers a valid client. EMBER_REMOTE_FUZZ sets the number of malformed frames (10,000 by default)."""
    total = int(os.environ.get("EMBER_REMOTE_FUZZ", "10000"))
    token = pki["token_text"]
    # plaintext loopback for the bulk (no handshake per connection); the TLS server gets its own pass below
    r = Running(Server(FLEX, token, port=0, ssl_context=None, max_frame=1 << 20, idle_timeout=5))
    rng = random.Random(0)
    sent = 0

    def authed() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        s.sendall(pack_frame("hello", {"token": token}))
        _read_reply(s)
        return s

    try:
        # 1. message-level garbage on one authenticated connection: every frame gets an err reply, and the
        #    connection keeps working
        s = authed()
        gen = _malformed_messages(rng)
        attacks = _graph_attacks()
        n_msgs = total * 8 // 10
        errors = 0
        for i in range(n_msgs):
            body = attacks[i % len(attacks)] if i % 10 == 0 else next(gen)
            s.sendall(_frame([VERSION, "batch", body]))
            kind, _ = _read_reply(s)
            assert kind == "err" or (kind == "ok" and i % 10), body  # a random message may happen to be valid
            errors += kind == "err"
            sent += 1
        assert errors > n_msgs * 0.8
        s.sendall(pack_frame("batch", [["upload", 1, ["float32", [2], np.float32([1, 2]).tobytes()]],
                                       ["download", 1]]))
        kind, reply = _read_reply(s)
        assert kind == "ok" and np.frombuffer(reply[0][2], np.float32).tolist() == [1.0, 2.0]
        s.close()
        # 2. frame-level garbage (each ends its connection): random bytes, oversized and truncated frames, other
        #    versions and kinds, before and after authentication
        rest = total - sent
        for i in range(rest):
            pre_auth = i % 2 == 0
            s = socket.create_connection(("127.0.0.1", r.port), timeout=10) if pre_auth else authed()
            choice = i % 6
            if choice == 0:
                payload = rng.randbytes(rng.randrange(1, 64))
            elif choice == 1:
                payload = struct.pack(">I", (1 << 20) + 1 + rng.randrange(1 << 30)) + b"\x00" * 8
            elif choice == 2:
                full = pack_frame("batch", [["sync"]])
                payload = full[:rng.randrange(1, len(full) - 1)]
            elif choice == 3:
                payload = _frame([VERSION + 1 + rng.randrange(5), "batch", []])
            elif choice == 4:
                payload = _frame(rng.choice([[], {}, "x", [VERSION], [VERSION, 3, []], [VERSION, "hello"]]))
            else:  # compressed frames, which no session of this server negotiated: garbage and a small bomb
                payload = _frame([VERSION, "z", rng.choice([rng.randbytes(40), _BOMB])])
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # the peer goes away (mid-frame, for short and truncated payloads)
            _drain(s)
            s.close()
            sent += 1
        assert sent == total
        _wait(lambda: r.sessions() == 0)
        d = Device.remote(f"ember://127.0.0.1:{r.port}/flex", token=token, insecure=True)
        assert (ember.arange(4.0, device=d) * 2).tolist() == [0.0, 2.0, 4.0, 6.0]
        assert r.server.stats["accepted"] >= 1
    finally:
        r.stop()


def test_garbage_against_tls_server_then_valid_client(tls: Running, pki: dict[str, Any]) -> None:
    rng = random.Random(1)
    for i in range(20):
        with socket.create_connection(("127.0.0.1", tls.port), timeout=10) as s:
            if i % 2:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                with ctx.wrap_socket(s) as t:
                    t.sendall(rng.randbytes(100))
                    _drain(t)
            else:
                s.sendall(rng.randbytes(300))
                _drain(s)
    assert ember.ones(2, device=_remote(tls, pki)).sum().item() == 2.0


def _read_reply(s: socket.socket) -> tuple[str, Any]:
    head = _recv(s, 4)
    (n,) = struct.unpack(">I", head)
    obj = msgpack.unpackb(_recv(s, n), raw=False)
    assert obj[0] == VERSION
    return obj[1], obj[2]


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


# -- the command -------------------------------------------------------------------------------------------------
def test_ember_serve_subprocess_init_serve_and_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    init = subprocess.run([sys.executable, "-m", "ember_remote.server", "--init", str(tmp_path / "srv")],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    fp = init.stdout.split("fingerprint (sha256): ")[1].split()[0]
    assert fp == fingerprint_of(tmp_path / "srv" / "cert.pem")
    assert (tmp_path / "srv" / "key.pem").stat().st_mode & 0o077 == 0
    srv = tmp_path / "srv"
    p = subprocess.Popen([sys.executable, "-m", "ember_remote.server", "--port", "0", "--token-file",
                          str(srv / "token"), "--cert", str(srv / "cert.pem"), "--key", str(srv / "key.pem")],
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stderr.readline()
        assert '"event": "listening"' in line, line
        port = int(line.split('"port": ')[1].split(",")[0])
        d = Device.remote(f"ember://127.0.0.1:{port}/flex", token=(srv / "token").read_text().strip(),
                          fingerprint=fp)
        assert (ember.arange(5.0, device=d) ** 2).sum().item() == 30.0
        p.terminate()
        assert p.wait(30) == 0
        rest = p.stderr.read()
        assert '"event": "stopped"' in rest
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_serve_refuses_plaintext_on_a_public_host(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("t" * 32)
    out = subprocess.run([sys.executable, "-m", "ember_remote.server", "--insecure", "--host", "0.0.0.0",
                          "--token-file", str(tmp_path / "t")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "loopback only" in out.stderr


def test_serve_command_several_devices_through_the_kit_helper(tmp_path: Path) -> None:
    """`ember serve --device flex --device flex+fusion(False)` (started as the kit runner starts it: a free port, a
    fresh token) serves both; the address's path picks one. A device given twice is refused."""
    from ember_remote.kit import start_server, stop_server

    proc, port, token = start_server(tmp_path, ["flex", "flex+fusion(False)"])
    try:
        for path, served in (("flex", "flex"), ("flex+fusion(False)", "flex+fusion(enabled=False)")):
            d = Device.remote(f"ember://127.0.0.1:{port}/{path}", token=token, insecure=True, timeout=30.0)
            assert d.stack.served == served
            assert (ember.arange(3.0, device=d) + 1).tolist() == [1.0, 2.0, 3.0]
    finally:
        stop_server(proc)
    assert proc.returncode == 0 and '"event": "stopped"' in (tmp_path / "serve.log").read_text()
    out = subprocess.run([sys.executable, "-m", "ember_remote.server", "--insecure", "--token-file",
                          str(tmp_path / "token"), "--device", "flex", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "given twice" in out.stderr
