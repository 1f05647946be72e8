"""Helpers for the HTTP tests: run a real ``tailguard_runtime`` process, talk to it, read it.

Every server is ``python -m tailguard_runtime`` started as a subprocess on port 0; the port is
read from its ``serving service=NAME on http://127.0.0.1:PORT`` log line, and
:func:`running_runtime` waits for ``/v2/health/ready`` before yielding. On exit it sends SIGTERM
to that PID only (the runtime drains, then exits), and kills it if it is still alive after a
timeout.

The probe model (:data:`PROBE_SOURCE`) is written into a temporary folder as a module and put on
the server's ``PYTHONPATH`` so the server can unpickle it. Its label and probabilities are simple
functions of the row, and five markers in column 0 make it misbehave on purpose: ``-999`` raises
``ValueError`` (the row's request should get 422), ``-998`` raises ``RuntimeError`` (500),
``-997`` raises ``SystemExit``, which no row isolation catches (it ends the model thread),
``-1`` sleeps ``x[1]`` milliseconds (a slow batch, for deadlines and draining), and ``-2``
holds its batch until the test opens gate ``x[1]`` (:func:`gated_row`, :func:`open_gate`).

This module has a name of its own (not ``conftest``) so that test modules can import it whatever
other conftest files the session loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Iterator

import httpx
import joblib
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
SERVING_LINE = re.compile(r"serving service=(\S+) on http://127\.0\.0\.1:(\d+) grpc=(\d+|None)")

DIGITS_MAX_QUEUE = 1024
"""The digits server's maxQueueSize, in rows."""
PROBE_MODULE = "tg_http_probe"
PROBE_FEATURES = 4
PROBE_SOURCE = '''
"""A deliberately misbehaving classifier for tailguard's HTTP tests (tests/harness/runtime.py)."""

import os
import time

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

POISON = -999.0
CRASH = -998.0
END_THREAD = -997.0
SLOW = -1.0
GATE = -2.0
GATES = os.path.dirname(os.path.abspath(__file__))


class ProbeClassifier(ClassifierMixin, BaseEstimator):
    """label = |round(sum(row))| mod n_classes; ``delay_s`` seconds per ``predict`` call.
    With ``calls_log`` (a file path), each ``predict`` call (one model call) appends a line
    holding its number of rows, so a test can count the model calls a batch cost. With
    ``reject_all``, a broken model: ``ValueError`` on every row."""

    def __init__(self, delay_s=0.0, calls_log=None, reject_all=False):
        self.delay_s = delay_s
        self.calls_log = calls_log
        self.reject_all = reject_all

    def fit(self, X, y):
        X = np.asarray(X, dtype=np.float64)
        self.classes_ = np.unique(np.asarray(y))
        self.n_features_in_ = X.shape[1]
        return self

    def _labels(self, X):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"expected {self.n_features_in_} features, got shape {X.shape}")
        if self.reject_all:
            raise ValueError("this model rejects every row")
        if (X[:, 0] == POISON).any():
            raise ValueError("poisoned row: x[0] == -999")
        if (X[:, 0] == CRASH).any():
            raise RuntimeError("crash row: x[0] == -998")
        if (X[:, 0] == END_THREAD).any():
            raise SystemExit("end-thread row: x[0] == -997")
        return np.abs(np.rint(X.sum(axis=1))).astype(np.int64) % len(self.classes_)

    def predict(self, X):
        if self.calls_log:
            with open(self.calls_log, "a") as log:
                log.write(f"{len(X)}\\n")
        labels = self._labels(X)
        X = np.asarray(X, dtype=np.float64)
        pause = self.delay_s + float(X[X[:, 0] == SLOW, 1].sum()) / 1000.0
        if pause > 0:
            time.sleep(pause)
        for gate in X[X[:, 0] == GATE, 1]:  # wait until the test opens the gate (at most 60 s)
            path = os.path.join(GATES, f"gate-{int(gate)}")
            deadline = time.monotonic() + 60
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.005)
        return self.classes_[labels]

    def predict_proba(self, X):
        labels = self._labels(X)
        n = len(self.classes_)
        proba = np.full((labels.size, n), 0.25 / (n - 1))
        proba[np.arange(labels.size), labels] = 0.75
        return proba
'''


# -- processes -----------------------------------------------------------------------------------


@dataclass
class RuntimeServer:
    """One running ``tailguard_runtime`` process."""

    name: str
    proc: subprocess.Popen[str]
    port: int
    log: list[str] = field(default_factory=list)
    grpc_port: int | None = None
    """The gRPC service's port (``None``: not served)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        """``127.0.0.1:PORT`` of the gRPC service (what gRPC clients take)."""
        assert self.grpc_port is not None, "this runtime serves no gRPC"
        return f"127.0.0.1:{self.grpc_port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        """A new httpx client bound to this server (the caller closes it)."""
        kwargs.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.base_url, **kwargs)

    def log_text(self) -> str:
        return "".join(self.log)


def _pump(stream: Any, sink: list[str], found: threading.Event,
          port_box: list[int | None]) -> None:
    """Copy the server's stderr into ``sink`` (so the pipe never fills) and spot the ports
    (HTTP, then gRPC or ``None``)."""
    try:
        for line in stream:
            sink.append(line)
            if not port_box:
                match = SERVING_LINE.search(line)
                if match:
                    grpc = match.group(3)
                    port_box.extend((int(match.group(2)), None if grpc == "None" else int(grpc)))
                    found.set()
    finally:
        stream.close()
        found.set()


def stop_process(proc: subprocess.Popen[str], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM ``proc`` (this PID only), wait up to ``timeout_s``, then SIGKILL; return its code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout=timeout_s)


@contextlib.contextmanager
def running_runtime(config: dict[str, Any], workdir: Path,
                    pythonpath: tuple[Path, ...] = ()) -> Iterator[RuntimeServer]:
    """Start a runtime for ``config`` (written to ``workdir``) and stop it on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / f"{config['name']}-{time.monotonic_ns()}.json"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    env = dict(os.environ)
    paths = [str(p) for p in pythonpath]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailguard_runtime", "--config", str(config_path),
         "--host", "127.0.0.1", "--port", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env, text=True)
    log: list[str] = []
    found = threading.Event()
    port_box: list[int | None] = []
    pump = threading.Thread(target=_pump, args=(proc.stderr, log, found, port_box),
                            name=f"stderr-{proc.pid}", daemon=True)
    pump.start()
    try:
        found.wait(STARTUP_TIMEOUT_S)
        if not port_box:
            raise RuntimeError(f"runtime {config['name']} did not start (exit code "
                               f"{proc.poll()}):\n{''.join(log)}")
        port, grpc_port = port_box
        assert port is not None
        server = RuntimeServer(config["name"], proc, port, log, grpc_port)
        wait_ready(server)
        yield server
    finally:
        stop_process(proc)
        pump.join(timeout=10)


def wait_ready(server: RuntimeServer, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Poll ``/v2/health/ready`` until it answers 200."""
    deadline = time.monotonic() + timeout_s
    with server.client(timeout=5.0) as client:
        while True:
            try:
                if client.get("/v2/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"runtime {server.name} never became ready:\n"
                                   f"{server.log_text()}")
            time.sleep(0.05)


def batching(max_batch_size: int = 32, max_wait_ms: float = 0, max_queue_size: int = 256,
             timeout_ms: float = 10_000) -> dict[str, Any]:
    """The ``batching`` block of a runtime config."""
    return {"maxBatchSize": max_batch_size, "maxWaitMs": max_wait_ms,
            "maxQueueSize": max_queue_size, "timeoutMs": timeout_ms}


def file_model(path: Path, role: str = "primary") -> dict[str, Any]:
    """A ``models`` entry for a joblib file, with its sha256."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"role": role, "uri": path.resolve().as_uri(), "sha256": digest}


class GoodClient:
    """A good client beside an attack: in a thread of its own, it posts ``body`` (JSON bytes)
    to ``path`` of ``server`` back to back until the block ends; :attr:`answers` holds the
    status codes. Entering waits for its first answer; :meth:`goes_on` for a few more, so a
    test can tell the server kept serving it through the attack."""

    WAIT_S = 60.0

    def __init__(self, server: "RuntimeServer", path: str, body: bytes) -> None:
        self.server, self.path, self.body = server, path, body
        self.answers: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-client")

    def _run(self) -> None:
        with self.server.client() as client:
            while not self._stop.is_set():
                self.answers.append(client.post(
                    self.path, content=self.body,
                    headers={"Content-Type": "application/json"}).status_code)

    def _until(self, count: int) -> None:
        deadline = time.monotonic() + self.WAIT_S
        while len(self.answers) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def __enter__(self) -> "GoodClient":
        self._thread.start()
        self._until(1)
        return self

    def goes_on(self, more: int = 5) -> None:
        """Wait until it has ``more`` answers beyond those it has now (at most 60 s)."""
        self._until(len(self.answers) + more)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.WAIT_S)


# -- wire helpers --------------------------------------------------------------------------------


def raw_exchange(port: int, head: bytes,
                 chunks: Iterable[bytes] = ()) -> tuple[int, dict[str, str], bytes]:
    """Send a hand-written HTTP/1.1 request (``head``, then each of ``chunks``) and read one
    whole response (:func:`read_response`). A server that answers before the body is sent and
    closes (a 413 for a body it refuses unread) may reset the upload: the answer is read all
    the same, as HTTP clients do."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            for chunk in chunks:
                sock.sendall(chunk)
        return read_response(sock)


_UNREAD: "weakref.WeakKeyDictionary[socket.socket, bytes]" = weakref.WeakKeyDictionary()
"""Bytes read from a socket past the response :func:`read_response` returned (the start of
the next one, when a server writes two answers back to back), kept for its next call."""


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one whole HTTP/1.1 response from ``sock``: status, headers (lowercase names) and
    body (all ``Content-Length`` bytes, or every chunk, de-chunked). Bytes read past it are
    kept for the next call on the same socket. Fails the test if the connection closes
    first."""
    data = _UNREAD.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, f"connection closed before a response: {data!r}"
        data += more
    raw_head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    if headers.get("transfer-encoding") == "chunked":
        while (done := _dechunk(body)) is None:
            more = sock.recv(65536)
            assert more, "connection closed mid-body"
            body += more
        body, rest = done
    else:
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            more = sock.recv(65536)
            assert more, "connection closed mid-body"
            body += more
        body, rest = body[:length], body[length:]
    if rest:
        _UNREAD[sock] = rest
    return int(status_line.split()[1]), headers, body


def _dechunk(raw: bytes) -> tuple[bytes, bytes] | None:
    """The payload of the chunked body at the start of ``raw`` and the bytes after it;
    ``None`` while it is incomplete."""
    out = b""
    while True:
        size_line, found, rest = raw.partition(b"\r\n")
        if not found:
            return None
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            if not rest.startswith(b"\r\n"):  # no trailers are sent to these tests
                return None
            return out, rest[2:]
        if len(rest) < size + 2:
            return None
        out, raw = out + rest[:size], rest[size + 2:]


def v2_body(x: np.ndarray, *, nested: bool = False, datatype: str = "FP64",
            **extra: Any) -> dict[str, Any]:
    """A v2 ``/infer`` body for ``x`` of shape ``(n_rows, n_features)``."""
    values = x.astype(np.int64) if datatype == "INT64" else x
    data = values.tolist() if nested else values.ravel().tolist()
    body: dict[str, Any] = {"inputs": [{"name": "input-0", "shape": list(x.shape),
                                        "datatype": datatype, "data": data}]}
    body.update(extra)
    return body


def v1_body(x: np.ndarray) -> dict[str, Any]:
    return {"instances": x.tolist()}


def v2_outputs(doc: dict[str, Any]) -> dict[str, np.ndarray]:
    """The response's output tensors by name, reshaped to their declared shape."""
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in doc["outputs"]}


def error_of(response: httpx.Response) -> str:
    """The protocol's ``{"error": "..."}`` message; fails the test for any other body shape."""
    doc = response.json()
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    assert isinstance(doc["error"], str) and doc["error"], doc
    return doc["error"]


Labels = tuple[tuple[str, str], ...]


def scrape(client: httpx.Client) -> dict[tuple[str, Labels], float]:
    """``/metrics`` as ``{(sample name, sorted labels): value}``."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    samples: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric_families(client: httpx.Client) -> dict[str, Any]:
    """``/metrics`` parsed into families by name (counters lose their ``_total`` suffix)."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def labels(model: str, role: str = "primary", version: str = "1", **more: str) -> Labels:
    return tuple(sorted({"model": model, "version": version, "role": role, **more}.items()))


# -- probe model --------------------------------------------------------------------------------


def make_probe(probe_module: tuple[ModuleType, Path], folder: Path, name: str,
               delay_s: float = 0.0, calls_log: Path | None = None,
               reject_all: bool = False) -> tuple[Any, Path]:
    """Fit a :class:`ProbeClassifier` (4 features, classes 0..2) and save it under ``folder``
    (``calls_log``: the file its model calls are logged to, one line each; None: not logged;
    ``reject_all``: a broken model that raises ``ValueError`` on every row)."""
    module, _ = probe_module
    folder.mkdir(parents=True, exist_ok=True)
    log = None if calls_log is None else str(calls_log)
    model = module.ProbeClassifier(delay_s=delay_s, calls_log=log, reject_all=reject_all).fit(
        np.zeros((3, PROBE_FEATURES)), np.array([0, 1, 2]))
    path = folder / f"{name}.joblib"
    joblib.dump(model, path)
    return model, path


def probe_rows(n: int, seed: int) -> np.ndarray:
    """``n`` well-behaved probe rows (column 0 never a marker)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.0, 10.0, size=(n, PROBE_FEATURES)).round(2)


def slow_row(ms: float) -> np.ndarray:
    """One probe row that makes its batch sleep ``ms`` milliseconds."""
    return np.array([[-1.0, float(ms), 2.0, 3.0]])


_GATES = itertools.count(1)


def new_gate() -> int:
    """A gate number not used before in this session (the gates live beside the probe
    module, which lives as long as the session)."""
    return next(_GATES)


def gated_row(gate: int) -> np.ndarray:
    """One probe row that holds its batch until :func:`open_gate` opens ``gate``
    (from :func:`new_gate`)."""
    return np.array([[-2.0, float(gate), 2.0, 3.0]])


def open_gate(probe_module: tuple[ModuleType, Path], gate: int) -> None:
    """Let the batches held by :func:`gated_row` ``(gate)`` finish."""
    (probe_module[1] / f"gate-{gate}").touch()


@contextlib.contextmanager
def probe_runtime(probe_module: tuple[ModuleType, Path], workdir: Path, *, name: str = "probe",
                  delay_s: float = 0.0, fallback: bool = False, calls_log: Path | None = None,
                  **config: Any) -> Iterator[tuple[RuntimeServer, Any]]:
    """A runtime serving a probe model; yields the server and the model object it serves
    (``calls_log``: where the primary logs its model calls, see :func:`make_probe`)."""
    model, path = make_probe(probe_module, workdir, f"{name}-primary", delay_s, calls_log)
    models = [file_model(path)]
    if fallback:
        _, fallback_path = make_probe(probe_module, workdir, f"{name}-fallback", delay_s)
        models.append(file_model(fallback_path, "fallback"))
    full = {"name": name, "models": models, "batching": batching(),
            "slo": {"windowSeconds": 120}, "drainGraceSeconds": 10, **config}
    with running_runtime(full, workdir, pythonpath=(probe_module[1],)) as server:
        yield server, model
