"""A real HTTPS (or HTTP) server on 127.0.0.1 that serves model files and misbehaves on cue.

Each path answers as its :class:`Route` says: the bytes, a redirect, a status, a stall after
a prefix, or a body without a Content-Length. The server counts the GETs of every path (its
query string left out), so a
test can tell whether a second start downloaded again. TLS uses a certificate from
:class:`harness.kube.pki.Authority`, made by the test.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from harness.kube.pki import Authority, KeyPair


@dataclass(frozen=True)
class Route:
    """How one path answers. ``kind``: ``file`` (``body`` with its length), ``unsized``
    (``body`` with no Content-Length, ended by closing), ``redirect`` (302 to ``location``),
    ``status`` (``status`` with an empty body), ``stall`` (``body`` announced twice as long,
    then silence until the server stops), ``fail_first`` (503 for the first ``failures``
    GETs, then ``body``)."""

    kind: str
    body: bytes = b""
    location: str = ""
    status: int = 200
    failures: int = 0


class ModelServer:
    """Serve ``routes`` on ``address`` (TLS with a certificate ``authority`` signs for
    127.0.0.1, or with ``certificate``) until :meth:`stop`."""

    def __init__(self, routes: dict[str, Route], authority: Authority | None = None, *,
                 address: tuple[str, int] = ("127.0.0.1", 0),
                 certificate: KeyPair | None = None) -> None:
        self.routes = routes
        self.hits: collections.Counter[str] = collections.Counter()
        self._stopping = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                path = self.path.split("?", 1)[0]
                owner.hits[path] += 1
                route = owner.routes.get(path)
                if route is None:
                    self._answer(404, b"")
                elif route.kind == "file":
                    self._answer(200, route.body)
                elif route.kind == "fail_first":
                    failed = owner.hits[path] <= route.failures
                    self._answer(503 if failed else 200, b"" if failed else route.body)
                elif route.kind == "redirect":
                    self.send_response(302)
                    self.send_header("Location", route.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif route.kind == "status":
                    self._answer(route.status, b"")
                elif route.kind == "unsized":
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(route.body)
                    self.close_connection = True
                elif route.kind == "stall":
                    self.send_response(200)
                    self.send_header("Content-Length", str(2 * len(route.body)))
                    self.end_headers()
                    self.wfile.write(route.body)
                    self.wfile.flush()
                    owner._stopping.wait(60)
                    self.close_connection = True

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = http.server.ThreadingHTTPServer(address, Handler)
        self._server.daemon_threads = True
        self.scheme = "http"
        if authority is not None:
            certificate = authority.serving("models", dns=["localhost"], ips=["127.0.0.1"])
        if certificate is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(certificate.cert, certificate.key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        """The URL of ``path`` on this server."""
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}{path}"

    def stop(self) -> None:
        """Release stalled answers, stop serving, close the socket."""
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()


def sha256_of(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def joblib_bytes(obj: object, folder: Path, name: str = "model.joblib") -> bytes:
    """``obj`` saved with ``joblib.dump`` into ``folder``, and the file's bytes."""
    import joblib

    path = folder / name
    joblib.dump(obj, path)
    return path.read_bytes()


class LeavesAMark:
    """Unpickling this object makes the folder ``path``: a model file that shows whether it
    was ever unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.path),))


def main(argv: list[str] | None = None) -> None:
    """Serve files over HTTPS until killed: ``--cert C --key K --host H --port P
    --file /PATH=LOCAL ... --redirect /PATH=LOCATION ...`` (any other path: 404); prints ``serving`` once it listens (the real-node tests start it
    inside the cluster's namespace, where the pods reach it)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--file", action="append", default=[])
    parser.add_argument("--redirect", action="append", default=[])
    args = parser.parse_args(argv)
    routes = {}
    for item in args.file:
        path, _, local = item.partition("=")
        routes[path] = Route("file", Path(local).read_bytes())
    for item in args.redirect:
        path, _, location = item.partition("=")
        routes[path] = Route("redirect", location=location)
    server = ModelServer(routes, address=(args.host, args.port),
                         certificate=KeyPair(Path(args.cert), Path(args.key)))
    print(f"serving {server.url('/')}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
