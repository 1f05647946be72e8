"""Hostile clients on the gRPC port: a flood of streams on one connection, clients that
open calls and never read a byte, and a connection flooded with pings. Each is refused or
contained by gRPC's own bounds and the per-address cap on calls
(``tailguard_runtime.rpc.service``), and a good client is served meanwhile on both ports;
draining refuses new calls ``UNAVAILABLE``.

The never-reading and pinging clients speak HTTP/2 by hand (the frames of RFC 9113, header
blocks as HPACK literals without Huffman coding, RFC 7541 §6.2.2), so that one can advertise
a receive window of 0 and then never read, and the other ping with no call: no gRPC library
lets a client misbehave that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton

from harness.runtime import (
    RuntimeServer,
    batching,
    probe_runtime,
    running_runtime,
    scrape,
    slow_row,
    v2_body,
)

pb: Any = triton.service_pb2  # Triton's copy of the protocol (see test_grpc.py)
pb_grpc: Any = triton.service_pb2_grpc

QUEUE_ROWS = 64
MAX_CALLS = 2 * QUEUE_ROWS  # at least 256: tailguard_runtime.rpc.service.max_concurrent_calls
MAX_CALLS = max(MAX_CALLS, 256)


@pytest.fixture(scope="module")
def iris_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeServer]:
    config = {"name": "iris",
              "models": [{"uri": "builtin://iris/logistic-regression"}],
              "batching": batching(max_batch_size=32, max_queue_size=QUEUE_ROWS,
                                   timeout_ms=10_000)}
    with running_runtime(config, tmp_path_factory.mktemp("grpc-hostile")) as server:
        yield server


ROW = np.array([[5.1, 3.5, 1.4, 0.2]])


def _request(model: str = "iris") -> Any:
    return pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input-0", datatype="FP64", shape=[1, 4])],
        raw_input_contents=[ROW.astype("<f8").tobytes()])


def _good_clients_are_served(server: RuntimeServer) -> None:
    with server.client(timeout=10) as http:
        assert http.get("/v2/health/ready").status_code == 200
        assert http.post("/v2/models/iris/infer", json=v2_body(ROW)).status_code == 200
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(_request(), timeout=10)
        assert np.frombuffer(answer.raw_output_contents[0], "<i8").tolist() == [0]


def test_a_flood_of_calls_on_one_connection_is_served_or_refused_never_stuck(
        iris_server: RuntimeServer) -> None:
    """Ten times the calls the process takes at once, on one connection: each is answered,
    shed (``RESOURCE_EXHAUSTED``: the queue, or the process's cap on calls) or refused as a
    stream past the connection's cap (``UNAVAILABLE``, safe to retry); none is lost or an
    internal error, and nothing stays queued."""
    calls = 10 * MAX_CALLS

    async def flood() -> dict[str, int]:
        async with grpc.aio.insecure_channel(iris_server.grpc_target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            async def one() -> str:
                try:
                    await stub.ModelInfer(_request(), timeout=60)
                    return "OK"
                except grpc.aio.AioRpcError as exc:
                    return str(exc.code().name)

            outcomes = await asyncio.gather(*(one() for _ in range(calls)))
        counts: dict[str, int] = {}
        for outcome in outcomes:
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    counts = asyncio.run(flood())
    assert set(counts) <= {"OK", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}, counts
    assert sum(counts.values()) == calls and counts.get("OK", 0) > 0, counts
    _good_clients_are_served(iris_server)
    assert _in_flight(iris_server) == 0


# -- a client that never reads ------------------------------------------------------------------


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame (RFC 9113 §4.1)."""
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + \
        struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name (RFC 7541 §6.2.2); names
    and values here are shorter than 127 bytes."""
    return b"\x00" + bytes((len(name),)) + name.encode() + bytes((len(value),)) + value.encode()


SETTINGS, HEADERS, DATA = 0x4, 0x1, 0x0
END_STREAM, END_HEADERS = 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


@contextlib.contextmanager
def never_reading(target: str, streams: int, source: str) -> Iterator[socket.socket]:
    """A TCP connection from the loopback address ``source`` that says it can receive nothing
    (initial window 0), opens ``streams`` ModelInfer calls, and never reads."""
    host, port = target.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        message = _request().SerializeToString()
        body = b"\x00" + struct.pack(">I", len(message)) + message  # a gRPC message
        head = b"".join(_literal(n, v) for n, v in (
            (":method", "POST"), (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", target), ("content-type", "application/grpc"), ("te", "trailers")))
        out = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
               _frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0))]
        for i in range(streams):
            stream = 2 * i + 1
            out += [_frame(HEADERS, END_HEADERS, stream, head),
                    _frame(DATA, END_STREAM, stream, body)]
        sock.sendall(b"".join(out))
        yield sock
    finally:
        sock.close()


def _in_flight(server: RuntimeServer) -> float:
    with server.client() as http:
        return sum(v for (name, _), v in scrape(http).items()
                   if name == "tailguard_in_flight_requests")


def test_clients_that_never_read_hold_no_more_than_their_addresses_calls(
        iris_server: RuntimeServer) -> None:
    """Two clients, each from its own loopback address, each opening twice the calls the
    whole process takes: each address holds at most its quarter, the rest of its calls end
    ``RESOURCE_EXHAUSTED`` at once, and a good client (127.0.0.1) is served on both ports."""
    with iris_server.client() as http:
        before = _address_limit_refusals(http)
    with never_reading(iris_server.grpc_target, 2 * MAX_CALLS, "127.0.0.3"):
        time.sleep(1.0)  # its calls reach the server; their answers cannot leave
        _good_clients_are_served(iris_server)
        with never_reading(iris_server.grpc_target, 2 * MAX_CALLS, "127.0.0.4"):
            time.sleep(1.0)
            _good_clients_are_served(iris_server)
            with iris_server.client() as http:
                assert _address_limit_refusals(http) > before
    # both closed: nothing of theirs stays in the queue
    deadline = time.monotonic() + 10
    while _in_flight(iris_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _in_flight(iris_server) == 0
    _good_clients_are_served(iris_server)


def _address_limit_refusals(http: Any) -> float:
    return sum(v for (name, labels), v in scrape(http).items()
               if name == "tailguard_rejections_total"
               and dict(labels).get("reason") == "address_limit")


PING, GOAWAY = 0x6, 0x7
ENHANCE_YOUR_CALM = 0xB


def _ping_until_closed(target: str, pings: int, every_s: float) -> list[tuple[int, bytes]]:
    """Open an HTTP/2 connection with no call, send up to ``pings`` PING frames ``every_s``
    (s) apart while reading what comes back, and return each frame ``(type, payload)`` the
    server sent until it closed the connection.

    Raises:
        AssertionError: the connection is still open 10 s after the last ping.
    """
    host, port = target.rsplit(":", 1)
    data = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(SETTINGS, 0, 0))
        closed = False
        for k in range(pings):
            try:
                sock.sendall(_frame(PING, 0, 0, struct.pack(">Q", k)))
            except OSError:  # the server closed it: what it sent before is still to read
                break
            time.sleep(every_s)
        deadline = time.monotonic() + 10
        while not closed:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError("the connection is open 10 s after the pings") from None
            except ConnectionResetError:
                chunk = b""
            closed = not chunk
            data += chunk
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[9:9 + length]))
        data = data[9 + length:]
    return frames


def test_a_client_that_pings_without_calls_is_told_to_calm_down_and_closed(
        iris_server: RuntimeServer) -> None:
    """A connection with no call that sends a PING every 50 ms (gRPC's policy allows one
    per ``MIN_CLIENT_PING_INTERVAL_MS`` with calls, none without them: a ping flood keeps
    the server's event loop busy) gets a ``GOAWAY`` with ``ENHANCE_YOUR_CALM`` and
    ``too_many_pings`` once it passes ``grpc.http2.max_ping_strikes`` (2), and the server
    closes it; a good client is served meanwhile."""
    frames = _ping_until_closed(iris_server.grpc_target, pings=20, every_s=0.05)
    goaways = [payload for kind, payload in frames if kind == GOAWAY]
    assert goaways, [kind for kind, _ in frames]
    _, code = struct.unpack(">II", goaways[-1][:8])
    assert code == ENHANCE_YOUR_CALM and b"too_many_pings" in goaways[-1][8:], goaways
    pongs = sum(1 for kind, _ in frames if kind == PING)
    assert pongs < 20, f"all {pongs} pings answered"
    _good_clients_are_served(iris_server)


def test_draining_refuses_new_calls_unavailable_and_answers_admitted_ones(
        tmp_path: Path, probe_module: tuple[ModuleType, Path]) -> None:
    with probe_runtime(probe_module, tmp_path, name="drain", drainGraceSeconds=10) as (server, _):
        client = triton.InferenceServerClient(url=server.grpc_target)
        answered: dict[str, Any] = {}
        slow = triton.InferInput("input-0", [1, 4], "FP64")
        slow.set_data_from_numpy(slow_row(1500))
        admitted = threading.Thread(target=lambda: answered.update(
            slow=client.infer("drain", [slow], client_timeout=30)))
        admitted.start()
        try:
            deadline = time.monotonic() + 10
            while _in_flight(server) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            server.proc.send_signal(signal.SIGTERM)
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                refused: Any = None
                while refused is None and time.monotonic() < deadline:
                    try:
                        stub.ModelInfer(_request("drain"), timeout=5)
                    except grpc.RpcError as exc:
                        refused = exc
        finally:
            admitted.join(timeout=30)
            client.close()
        assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert "draining" in refused.details()
        assert answered["slow"].as_numpy("predict").shape == (1,)
        assert server.proc.wait(timeout=30) == 0
